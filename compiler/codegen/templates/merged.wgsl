// {{MEMBERS}} quick-tier kernels in one pipeline (compiler/merge_quick.py): {{LABELS}}.
// The last lifted size picks the one a dispatch runs.
{{SIZES}}
{{STORAGE}}

{{DECLS}}

@compute @workgroup_size({{WORKGROUP_SIZE}})
fn main({{PARAMS}}) {
  switch {{SELECTOR}} {
{{CASES}}
    default: {}
  }
}
