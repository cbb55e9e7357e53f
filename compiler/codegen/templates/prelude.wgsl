// Helpers that WGSL lacks, shared by every generated kernel that needs them.
// Each stays accurate to ~1e-7 relative over the whole f32 range (tests check it).

fn mn_tanh(x: f32) -> f32 {
    // tanh(x) = -expm1(-2|x|) / (2 + expm1(-2|x|)), signed: never overflows, unlike the
    // textbook (e^x - e^-x) / (e^x + e^-x), and keeps f32's relative precision near 0, where
    // (1 - e^-2|x|) / (1 + e^-2|x|) cancels (9e-6 off at 0.005)
    let em = mn_expm1(-2.0 * abs(x));
    return sign(x) * (-em / (2.0 + em));
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
    // integer exponents work for negative bases, as in PyTorch; others follow pow(), as do
    // those of 2^24 or more (all even: of |x|)
    if (c == round(c) && abs(c) < 16777216.0) {
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
    return pow(select(x, abs(x), abs(c) >= 16777216.0), c);
}

fn mn_silu_grad(x: f32) -> f32 {
    let s = mn_sigmoid(x);
    return s * (1.0 + x * (1.0 - s));
}

fn mn_softplus(x: f32) -> f32 {
    // PyTorch's threshold: past 20, softplus(x) is x to f32 precision
    return select(max(x, 0.0) + mn_log1p(exp(-abs(x))), x, x > 20.0);
}

// log(1 + x) for x >= 0 without rounding 1 + x (series to x^8 below 1/16): log(1.0 + x) loses
// x's low digits, and GPUs' log is exact to an absolute, not relative, error near 1, which
// made softplus(-8.7) 2e-3 off on NVIDIA (Mish's ONNX node test)
fn mn_log1p(x: f32) -> f32 {
    if (x < 0.0625) {
        return x * (1.0 - x * (0.5 - x * (0.33333334 - x * (0.25 - x * (0.2 - x * (0.16666667
            - x * (0.14285715 - x * 0.125)))))));
    }
    return log(1.0 + x);
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

// The elementary functions below follow Cephes' single-precision ones (S. Moshier): a range
// reduction and a short polynomial, relative error ~1e-7; drivers' asin, asinh, ... are
// textbook formulas that lose most digits near 0 or overflow far from it.
// |x| less the nearest even multiple j of pi/4 (as (r, j mod 8)), pi/4 split in three so that
// each product is exact: a few ulp up to |x| ~ 8192, beyond which the reduction loses digits
fn mn_reduce_pi4(a: f32) -> vec2<f32> {
    var j = u32(a * 1.2732395447351628);
    var y = f32(j);
    if ((j & 1u) == 1u) {
        j = j + 1u;
        y = y + 1.0;
    }
    let r = ((a - y * 0.78515625) - y * 2.4187564849853515625e-4) - y * 3.77489497744594108e-8;
    return vec2<f32>(r, f32(j & 7u));
}

fn mn_sin_poly(r: f32) -> f32 {
    let z = r * r;
    return ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1) * z * r + r;
}

fn mn_cos_poly(r: f32) -> f32 {
    let z = r * r;
    return ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2) * z * z - 0.5 * z + 1.0;
}

// sin, cos, tan of their own: drivers' builtins may be approximations with an absolute error
// (sin(1e-6) off by 13% on one), useless near the functions' zeros
fn mn_sin(x: f32) -> f32 {
    if (mn_nonfinite(x) > 0.0) {
        return bitcast<f32>(0x7fc00000u);
    }
    let rj = mn_reduce_pi4(abs(x));
    let j = u32(rj.y);
    let y = select(mn_sin_poly(rj.x), mn_cos_poly(rj.x), (j & 3u) == 2u);
    return select(y, -y, (x < 0.0) != (j > 3u));
}

fn mn_cos(x: f32) -> f32 {
    if (mn_nonfinite(x) > 0.0) {
        return bitcast<f32>(0x7fc00000u);
    }
    let rj = mn_reduce_pi4(abs(x));
    let j = u32(rj.y);
    let y = select(mn_cos_poly(rj.x), mn_sin_poly(rj.x), (j & 3u) == 2u);
    return select(y, -y, (j > 3u) != ((j & 3u) > 1u));
}

fn mn_tan(x: f32) -> f32 {
    if (mn_nonfinite(x) > 0.0) {
        return bitcast<f32>(0x7fc00000u);
    }
    let rj = mn_reduce_pi4(abs(x));
    let r = rj.x;
    let z = r * r;
    var y = (((((9.38540185543e-3 * z + 3.11992232697e-3) * z + 2.44301354525e-2) * z + 5.34112807005e-2) * z
        + 1.33387994085e-1) * z + 3.33331568548e-1) * z * r + r;
    if ((u32(rj.y) & 2u) == 2u) {
        y = -1.0 / y;
    }
    return select(y, -y, x < 0.0);
}

fn mn_sinh(x: f32) -> f32 {
    let a = abs(x);
    if (a <= 1.0) {
        let z = x * x;
        return ((2.03721912945e-4 * z + 8.33028376239e-3) * z + 1.66667160211e-1) * z * x + x;
    }
    if (a < 88.0) {
        let e = exp(a);
        return sign(x) * (0.5 * e - 0.5 / e);
    }
    return sign(x) * exp(a - 0.6931471805599453);  // e^a / 2, finite up to sinh's own overflow
}

fn mn_cosh(x: f32) -> f32 {
    let a = abs(x);
    if (a < 88.0) {
        let e = exp(a);
        return 0.5 * e + 0.5 / e;
    }
    return exp(a - 0.6931471805599453);
}

fn mn_asin(x: f32) -> f32 {
    let a = abs(x);
    var z = a * a;
    var s = a;
    if (a > 0.5) {  // asin(a) = pi/2 - 2 asin(sqrt((1 - a) / 2))
        z = 0.5 * (1.0 - a);
        s = sqrt(z);
    }
    var r = ((((4.2163199048e-2 * z + 2.4181311049e-2) * z + 4.5470025998e-2) * z + 7.4953002686e-2) * z
        + 1.6666752422e-1) * z * s + s;
    if (a > 0.5) {
        r = 1.5707963267948966 - 2.0 * r;
    }
    return select(r, -r, x < 0.0);
}

fn mn_acos(x: f32) -> f32 {
    if (x < -0.5) {
        return 3.141592653589793 - 2.0 * mn_asin(sqrt(0.5 * (1.0 + x)));
    }
    if (x > 0.5) {
        return 2.0 * mn_asin(sqrt(0.5 * (1.0 - x)));
    }
    return 1.5707963267948966 - mn_asin(x);
}

fn mn_atan(x: f32) -> f32 {
    let a = abs(x);
    var y = 0.0;
    var t = a;
    if (a > 2.414213562373095) {  // tan(3 pi / 8)
        y = 1.5707963267948966;
        t = -1.0 / a;
    } else if (a > 0.41421356237309503) {  // tan(pi / 8)
        y = 0.7853981633974483;
        t = (a - 1.0) / (a + 1.0);
    }
    let z = t * t;
    y = y + (((8.05374449538e-2 * z - 1.38776856032e-1) * z + 1.99777106478e-1) * z - 3.33329491539e-1) * z * t + t;
    return select(y, -y, x < 0.0);
}

fn mn_asinh(x: f32) -> f32 {
    let a = abs(x);
    var r = log(a + sqrt(a * a + 1.0));
    if (a < 0.5) {
        let z = a * a;
        r = (((2.0122003309e-2 * z - 4.2699340972e-2) * z + 7.4847586088e-2) * z - 1.6666288134e-1) * z * a + a;
    } else if (a > 1500.0) {
        r = log(a) + 0.6931471805599453;
    }
    return select(r, -r, x < 0.0);
}

fn mn_acosh(x: f32) -> f32 {
    if (x > 1500.0) {
        return log(x) + 0.6931471805599453;
    }
    let z = x - 1.0;  // exact for x in [1, 2]
    if (z < 0.5) {
        return ((((1.7596881071e-3 * z - 7.5272886713e-3) * z + 2.6454905019e-2) * z - 1.1784741703e-1) * z
            + 1.4142135263) * sqrt(z);
    }
    return log(x + sqrt(z * (x + 1.0)));
}

fn mn_atanh(x: f32) -> f32 {
    let a = abs(x);
    var r = 0.5 * log((1.0 + a) / (1.0 - a));
    if (a < 0.5) {
        let z = a * a;
        r = ((((1.81740078349e-1 * z + 8.24370301058e-2) * z + 1.46691431730e-1) * z + 1.99782164500e-1) * z
            + 3.33337300303e-1) * z * a + a;
    }
    return select(r, -r, x < 0.0);
}

fn mn_ipow(x: i32, n: i32) -> i32 {
    // x^n by squaring, wrapping as i32 products do; n < 0: 1 / x^-n rounded toward zero (0 for x = 0)
    if (n < 0) {
        return select(select(0, 1 - 2 * (n & 1), x == -1), 1, x == 1);
    }
    var r = 1;
    var b = x;
    var k = u32(n);
    loop {
        if (k == 0u) { break; }
        if ((k & 1u) == 1u) { r = r * b; }
        b = b * b;
        k = k >> 1u;
    }
    return r;
}

fn mn_fmod(x: f32, y: f32) -> f32 {
    // C's fmod, exactly: |x| less the largest |y| * 2^k below it, until under |y| (each
    // subtraction is exact: Sterbenz); WGSL's % is x - y * trunc(x / y), off by the rounding
    // of x / y once the quotient passes 2^24. NaN, infinities and zeros are told by their bits.
    let bx = bitcast<u32>(x);
    let by = bitcast<u32>(y) & 0x7fffffffu;
    if ((bx & 0x7f800000u) == 0x7f800000u || by > 0x7f800000u || by == 0u) {
        return bitcast<f32>(0x7fc00000u);
    }
    if (by == 0x7f800000u) {
        return x;
    }
    let ay = bitcast<f32>(by);
    var r = bitcast<f32>(bx & 0x7fffffffu);
    for (var i = 0; i < 280; i = i + 1) {
        if (!(r >= ay)) { break; }
        let k = i32(bitcast<u32>(r) >> 23u) - i32(by >> 23u);
        var t = ldexp(ay, k);
        if (t > r) { t = ldexp(ay, k - 1); }
        r = r - t;
    }
    return bitcast<f32>(bitcast<u32>(r) | (bx & 0x80000000u));
}

fn mn_floor_mod(x: f32, y: f32) -> f32 {
    // numpy's remainder: the fmod moved to the divisor's sign (a zero too); exact but for that addition
    let r = mn_fmod(x, y);
    if (r == 0.0) {
        return bitcast<f32>(bitcast<u32>(y) & 0x80000000u);
    }
    return select(r, r + y, (r < 0.0) != (y < 0.0));
}
