/* nabla/custom.h — user-defined operations (custom calls).
 *
 * A custom op is a function of n_in tensors to n_out tensors computed by your
 * own C kernel. Register its definition once, then apply it with
 * nb_custom_call like any other op: it is lazy, it works inside every
 * transform, and the transforms use the rules you give:
 *
 *   static nb_status cube_infer(void *u, const nb_shape *is, const nb_dtype *id, int n_in,
 *                               nb_shape *os, nb_dtype *od, int n_out) {
 *     os[0] = is[0], od[0] = id[0];          // elementwise: same type out
 *     return NB_OK;
 *   }
 *   static nb_status cube_cpu(void *u, const nb_custom_buffer *in, int n_in,
 *                             nb_custom_buffer *out, int n_out) {
 *     ... read in[0].data, write out[0].data (contiguous, row-major) ...
 *   }
 *   static nb_status cube_vjp(void *u, nb_tensor *const *in, int n_in, nb_tensor *const *out,
 *                             nb_tensor *const *ct, int n_out, nb_tensor **in_ct) {
 *     in_ct[0] = nb_mul(ct[0], nb_mul_scalar(nb_square(in[0]), 3));   // nabla ops
 *     return in_ct[0] ? NB_OK : nb_last_status();
 *   }
 *   const nb_custom_op *cube = nb_custom_op_register(&(nb_custom_op_def){
 *       .name = "cube", .n_in = 1, .n_out = 1, .infer = cube_infer, .cpu = cube_cpu,
 *       .vjp = cube_vjp, .sharding = "... -> ..."});
 *   nb_tensor *y;
 *   nb_custom_call(cube, &x, 1, &y, 1);
 *
 * Callbacks report failures by returning a status; nb_set_error (tensor.h) gives it a
 * message (by convention starting with the op's name). A status returned
 * without a message gets a generic one naming the op and the callback.
 */
#ifndef NABLA_CUSTOM_H
#define NABLA_CUSTOM_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One array handed to a kernel: contiguous, row-major, of that shape and
 * dtype. Kernels read their inputs' data (never write it: it may be shared
 * with other tensors) and write every element of their outputs'. */
typedef struct nb_custom_buffer {
  void *data;
  nb_shape shape;
  nb_dtype dtype;
} nb_custom_buffer;

/* Shape and dtype inference, run by nb_custom_call when the op is applied (so
 * errors are eager): reads the inputs' types, writes out_shapes[0..n_out-1]
 * and out_dtypes[0..n_out-1]. Returns NB_OK, or an error status for inputs
 * the op does not accept (with nb_set_error for the message). */
typedef nb_status (*nb_custom_infer_fn)(void *user, const nb_shape *in_shapes,
                                        const nb_dtype *in_dtypes, int n_in, nb_shape *out_shapes,
                                        nb_dtype *out_dtypes, int n_out);

/* CPU kernel: computes the outputs from the inputs. Inputs are made
 * contiguous first (a strided or broadcast input is copied). Runs when the
 * outputs are realized; an error status stops that realization and is
 * returned by the call that realized (nb_eval, nb_to_host, ...). */
typedef nb_status (*nb_custom_cpu_fn)(void *user, const nb_custom_buffer *in, int n_in,
                                      nb_custom_buffer *out, int n_out);

/* CUDA kernel: the same contract with device pointers, enqueued on `stream`
 * (a cudaStream_t). Stored at registration for the CUDA backend; the
 * CPU-only build never calls it (CPU tensors always use the CPU kernel). */
typedef nb_status (*nb_custom_cuda_fn)(void *user, void *stream, const nb_custom_buffer *in,
                                       int n_in, nb_custom_buffer *out, int n_out);

/* Reverse-mode rule, written with nabla ops (so it is itself differentiable
 * and transformable: higher derivatives need the ops it uses to be
 * differentiable). in: the op's inputs, out: its outputs, cotangents: one per
 * output, of the output's shape and dtype (zeros where no cotangent flows).
 * Writes in_cotangents[k] for the inputs, each of exactly in[k]'s shape and
 * dtype, or leaves it NULL (zero). Unused cotangents cost nothing (lazy). */
typedef nb_status (*nb_custom_vjp_fn)(void *user, nb_tensor *const *in, int n_in,
                                      nb_tensor *const *out, nb_tensor *const *cotangents,
                                      int n_out, nb_tensor **in_cotangents);

/* Forward-mode rule, with nabla ops: tangents[k] has in[k]'s shape and dtype
 * (zeros for inputs without one). Writes out_tangents[j] of output j's shape
 * and dtype, or leaves it NULL (zero). */
typedef nb_status (*nb_custom_jvp_fn)(void *user, nb_tensor *const *in, nb_tensor *const *tangents,
                                      int n_in, nb_tensor *const *out, int n_out,
                                      nb_tensor **out_tangents);

/* Batching rule (nb_vmap): in[k] is batched (an extra leading dim of size
 * `batch`) where batched[k], else the same for every example; at least one is
 * batched. Writes out[j] with output j's per-example shape behind a leading
 * dim of size `batch`, and its dtype. Usually one nb_custom_call on the
 * whole batch (an elementwise op is its own batching rule). Without one, the
 * default applies the op once per example (slicing the batched inputs) and
 * stacks the results: correct for every op, but `batch` nodes instead of one. */
typedef nb_status (*nb_custom_batch_fn)(void *user, nb_tensor *const *in, const bool *batched,
                                        int n_in, int64_t batch, nb_tensor **out, int n_out);

typedef struct nb_custom_op_def {
  const char *name;         /* unique among registered ops; copied */
  int n_in, n_out;          /* n_in >= 0, n_out >= 1 */
  nb_custom_infer_fn infer; /* required */
  nb_custom_cpu_fn cpu;     /* required */
  nb_custom_cuda_fn cuda;   /* optional: see nb_custom_cuda_fn */
  nb_custom_vjp_fn vjp;     /* optional: reverse mode (grad, vjp, jacrev) is an error without */
  nb_custom_jvp_fn jvp;     /* optional: forward mode (jvp, jacfwd) is an error without */
  nb_custom_batch_fn batch; /* optional: default loops over the batch */
  /* Optional sharding rule, einsum-like: one operand per input, "->", one
   * result per output, separated by commas; an operand lists one factor name
   * per dimension (identifiers, space separated; "..." stands for any further
   * leading dims, at most once per operand, first). Dims with the same name
   * are sharded alike; a result's factors must appear in some operand.
   * E.g. matmul "m k, k n -> m n", elementwise "... -> ...". Its syntax and
   * counts are checked at registration; it is copied, for SPMD sharding. */
  const char *sharding;
  void *user; /* passed to every callback */
} nb_custom_op_def;

typedef struct nb_custom_op nb_custom_op;

/* Registers a copy of *def. NULL on error: NULL def, a name missing or
 * already registered, n_in < 0 or n_out < 1, no infer or cpu callback, a
 * malformed sharding rule. Registered ops live until the process exits.
 * Thread-safe. */
const nb_custom_op *nb_custom_op_register(const nb_custom_op_def *def);
/* The op registered under name, or NULL (no error recorded). */
const nb_custom_op *nb_custom_op_find(const char *name);
const char *nb_custom_op_name(const nb_custom_op *op);     /* NULL for NULL */
const char *nb_custom_op_sharding(const nb_custom_op *op); /* as registered; NULL if none */

/* Applies op: n_in and n_out must be the op's; writes n_out new tensors (in
 * the current scope) whose types the inference callback gave. On error every
 * out[j] is NULL. Differentiable through the op's VJP/JVP rules, batchable
 * through its batching rule or the default loop. */
nb_status nb_custom_call(const nb_custom_op *op, nb_tensor *const *in, int n_in, nb_tensor **out,
                         int n_out);

#ifdef __cplusplus
}
#endif
#endif
