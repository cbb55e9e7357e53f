// Helpers that WGSL lacks, shared by every generated kernel that needs them.
// Each stays accurate to ~1e-7 relative over the whole f32 range (tests check it).

fn mn_tanh(x: f32) -> f32 {
    // tanh(x) from exp(-2|x|): never overflows, unlike the textbook (e^x - e^-x) / (e^x + e^-x)
    let e = exp(-2.0 * abs(x));
    let t = (1.0 - e) / (1.0 + e);
    // near zero the formula cancels; the series x - x^3/3 + 2x^5/15 is exact there
    let x2 = x * x;
    let series = x * (1.0 - x2 * (0.33333333 - x2 * 0.13333333));
    return select(sign(x) * t, series, abs(x) < 0.005);
}

fn mn_sigmoid(x: f32) -> f32 {
    let e = exp(-abs(x));
    return select(e / (1.0 + e), 1.0 / (1.0 + e), x >= 0.0);
}

fn mn_erfc_pos(z: f32) -> f32 {
    // erfc for z >= 0, fractional error below 1.2e-7 (Chebyshev fit, Numerical Recipes' erfcc)
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
        t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 +
        t * (-0.82215223 + t * 0.17087277))))))));
    return t * exp(p);
}

fn mn_erf(x: f32) -> f32 {
    let z = abs(x);
    if (z < 0.5) {
        // Maclaurin series: relative error below 3e-8 on |x| < 0.5
        let x2 = x * x;
        return x * 1.1283791671 * (1.0 - x2 * (0.33333333333 - x2 * (0.1 - x2 * (0.0238095238 -
            x2 * (0.0046296296 - x2 * 0.0007575758)))));
    }
    return sign(x) * (1.0 - mn_erfc_pos(z));
}

fn mn_gelu(x: f32) -> f32 {
    return 0.5 * x * (1.0 + mn_erf(x * 0.7071067811865476));
}

fn mn_gelu_grad(x: f32) -> f32 {
    let cdf = 0.5 * (1.0 + mn_erf(x * 0.7071067811865476));
    return cdf + x * exp(-0.5 * x * x) * 0.3989422804014327;
}

fn mn_gelu_tanh(x: f32) -> f32 {
    return 0.5 * x * (1.0 + mn_tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

fn mn_gelu_tanh_grad(x: f32) -> f32 {
    let t = mn_tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 0.134145 * x * x);
}

fn mn_pow(x: f32, c: f32) -> f32 {
    // integer exponents work for negative bases, as in PyTorch; others follow pow()
    if (c == round(c)) {
        var r = 1.0;
        var b = select(x, 1.0 / x, c < 0.0);
        var n = u32(abs(c));
        loop {
            if (n == 0u) { break; }
            if ((n & 1u) == 1u) { r = r * b; }
            b = b * b;
            n = n >> 1u;
        }
        return r;
    }
    return pow(x, c);
}

fn mn_silu_grad(x: f32) -> f32 {
    let s = mn_sigmoid(x);
    return s * (1.0 + x * (1.0 - s));
}

fn mn_softplus(x: f32) -> f32 {
    // PyTorch's threshold: past 20, softplus(x) is x to f32 precision
    return select(max(x, 0.0) + log(1.0 + exp(-abs(x))), x, x > 20.0);
}

// exp(x) - 1 without the cancellation near 0 (Taylor to x^8 there: AdamW's bias corrections
// 1 - beta^t lose 4 of f32's 7 digits as exp(t log beta) - 1 in the first steps)
fn mn_expm1(x: f32) -> f32 {
    if (abs(x) < 0.5) {
        return x * (1.0 + x * (0.5 + x * (0.16666667 + x * (0.041666668 + x * (0.008333334
            + x * (0.0013888889 + x * (0.0001984127 + x * 0.0000248015873)))))));
    }
    return exp(x) - 1.0;
}

fn mn_nonfinite(x: f32) -> f32 {
    // exponent bits all ones: NaN or infinity (x != x may be folded away under fast math)
    return select(0.0, 1.0, (bitcast<u32>(x) & 0x7f800000u) == 0x7f800000u);
}
