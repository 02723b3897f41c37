/* src/backends/cpu/k_elementwise.h — CPU kernels of the elementwise family
 * (unary, binary, where, cast). */
#ifndef NABLA_K_ELEMENTWISE_H
#define NABLA_K_ELEMENTWISE_H

#include "cpu.h"

/* Every elementwise op except cast: node n->op with n->attrs.i[0] = the compute
 * dtype (inputs are converted to it, the op is evaluated in its domain: f64 in
 * double, f32/f16/bf16 in float, i32/i64/bool in int64, then the result is
 * converted once to out's dtype). in[k] are n->n_in views of any strides,
 * broadcast to out's shape here; out is contiguous. For where, in[0] is the
 * bool condition. */
nb_status nbi_cpu_elementwise(const nb_tensor *n, nbi_view *out, const nbi_view *in);

/* Cast: out = in[0] converted to out's dtype (same shape, any input strides).
 * Float -> int truncates toward zero and saturates (NaN -> 0); int -> int wraps
 * (two's complement); -> bool is != 0; narrowing float conversions round once to
 * nearest even. */
nb_status nbi_cpu_cast(const nb_tensor *n, nbi_view *out, const nbi_view *in);

#endif
