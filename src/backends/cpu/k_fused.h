/* src/backends/cpu/k_fused.h — the CPU backend's fused groups (k_fused.c):
 * its group_ok and run_group (backend.h, "fused groups"). */
#ifndef NABLA_K_FUSED_H
#define NABLA_K_FUSED_H

#include "cpu.h"

/* Whether the CPU runs group g: elementwise and row groups of f32 or f64
 * whose members all have a row function or row routine here (no predicates,
 * each elementwise member computing in its own dtype); an elementwise group
 * with at most NBI_ITER_MAX_OPS outputs and operands together; a row group
 * with rows of 2 to 16384 elements; a GEMM epilogue as nbi_cpu_gemm_epi_ok
 * says. ctx is unused (the emulated device asks it too). */
bool nbi_cpu_group_ok(void *ctx, const nbi_group *g);
/* Runs g (nbi_cpu_group_ok took it): in[k] is operand k's view (backend.h),
 * out[j] output slot j's contiguous buffer. Results of elementwise and row
 * groups are bitwise those of their members run one by one. */
nb_status nbi_cpu_run_group(void *ctx, const nbi_group *g, nbi_view *out, const nbi_view *in);

#endif
