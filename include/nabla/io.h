/* nabla/io.h — saving and loading trees: the safetensors format, and
 * checkpoints of a whole training state.
 *
 * safetensors (the format of Hugging Face's `safetensors` package): an 8-byte
 * little-endian header length N, N bytes of JSON naming each tensor's dtype,
 * shape and byte range, then the tensors' bytes, row-major. Files written
 * here load with `safetensors.numpy.load_file` / `safetensors.torch.load_file`
 * and files those write load here (test/golden/gen_safetensors.py checks
 * both directions). Dtypes: F32 F64 F16 BF16 I64 I32 I16 I8 U8 BOOL map to
 * nabla's dtypes of the same name; the format's others (U16, U32, U64, F8_*,
 * ...) are NB_ERR_IO errors naming the tensor and the dtype.
 * Little-endian hosts only (a big-endian one gets NB_ERR_IO).
 *
 * Memory: a loaded tensor wraps the file's memory map when the calling
 * thread's default device is the CPU and its data sits at a multiple of
 * its element size in the file (every file this library or Python's package
 * writes): no copy, and pages are read from disk when first touched. The
 * map lives until the last such tensor is released. It is private: writing
 * a loaded tensor (nb_assign, an in-place step) changes this process's copy
 * only. Do not truncate or rewrite the file in place while its tensors live
 * (reading a vanished page would be a SIGBUS); nb_save_safetensors replaces
 * a file by renaming a new one over it, which is safe. On another default
 * device (or at an unaligned offset) tensors are copied.
 *
 * Errors: every problem with a file (cannot open, too short, header longer
 * than the file or than the format's 100,000,000 bytes, bad JSON, unknown
 * dtype, a shape whose size does not match its byte range, byte ranges with
 * a gap, an overlap or not ending at the file's end, a BOOL byte other than
 * 0/1, a name that is not a tree name) is NB_ERR_IO with a message naming
 * the file and the problem, e.g.
 *   nb_load_safetensors: w.safetensors: tensor "b": data_offsets [24, 36]
 *   span 12 bytes but F32 of 2 elements needs 8
 * Nothing in a file can crash the loader (fuzzed: test/fuzz/).
 */
#ifndef NABLA_IO_H
#define NABLA_IO_H

#include "tree.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes every tensor of t (realizing what is pending) to path in tree order,
 * with metadata_kv[0..2 n_metadata) as the header's "__metadata__" (key,
 * value alternating, UTF-8, distinct keys; NULL when n_metadata is 0). The
 * file appears whole or not at all (written beside path, then renamed).
 * NB_ERR_IO naming path and the system's reason when writing fails;
 * NB_ERR_ARG for a tensor named "__metadata__" or bad metadata; NB_ERR_DTYPE
 * for a dtype safetensors lacks. */
nb_status nb_save_safetensors(const char *path, const nb_tree *t, const char *const *metadata_kv,
                              int n_metadata);
/* A new tree (the caller releases it) holding the file's tensors in the
 * order of their data, each realized, on the default device. NULL +
 * NB_ERR_IO naming the problem (see above). */
nb_tree *nb_load_safetensors(const char *path);
/* The same, also returning the "__metadata__" pairs: *metadata_kv gets 2 *
 * *n_metadata strings (key, value alternating, in file order) in one block
 * the caller frees with free(*metadata_kv); NULL and 0 when there are none
 * or on error. Both pointers NULL: nb_load_safetensors. */
nb_tree *nb_load_safetensors_meta(const char *path, char ***metadata_kv, int *n_metadata);

/* ---- checkpoints ----------------------------------------------------------------------
 * A whole training state in one safetensors file: params as "params.<name>",
 * opt_state (nb_optim_init's tree, NULL for none) as "opt.<name>", step as a
 * 0-d i64 "step", key (an i64 [2] random key, NULL for none) as "key", and
 * __metadata__ {"format": "nabla.checkpoint", "version": "1"}. Python reads
 * it as any safetensors file. Saving realizes what is pending; the file
 * appears whole or not at all.
 *
 *   nb_save_checkpoint("run.ckpt", params, state, step, key);
 *   ...                                        // a new process:
 *   nb_tree *params, *state; int64_t step; nb_tensor *key;
 *   nb_load_checkpoint("run.ckpt", &params, &state, &step, &key);
 *   // go on: nb_optim_step(opt, params, grads, state) with the same opt
 *
 * Continuing from a checkpoint gives the same numbers, bit for bit, as a run
 * that never stopped (test io_ckpt::checkpoint_resume_is_bit_exact). */
nb_status nb_save_checkpoint(const char *path, const nb_tree *params, const nb_tree *opt_state,
                             int64_t step, nb_tensor *key);
/* New trees *params and *opt_state (the caller releases them; an empty tree
 * when the file has none), *step, and *key (a tensor in the caller's scope,
 * NULL when the file has none); any output pointer may be NULL to skip it.
 * NB_ERR_IO naming the file when it is not a nabla checkpoint (or any
 * nb_load_safetensors error); on error the outputs are NULL. */
nb_status nb_load_checkpoint(const char *path, nb_tree **params, nb_tree **opt_state, int64_t *step,
                             nb_tensor **key);

#ifdef __cplusplus
}
#endif
#endif
