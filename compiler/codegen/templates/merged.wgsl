// {{MEMBERS}} quick-tier kernels in one pipeline (codegen/merge_quick.py): {{LABELS}}.
// The last lifted value picks the one a dispatch runs.
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
