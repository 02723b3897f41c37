/* src/backends/cuda/cuda_render.h — internal to the generator: cuda_render.c
 * (elementwise groups, the pieces every kernel shares, the cache, run_group) and
 * cuda_render_rows.c (row groups). Nothing else includes it.
 *
 * A rendered source is the preamble, a comment giving the kernel's shapes, the
 * formula list's expressions for the (domain, op) pairs the group uses as small
 * functions (nbo_<f|d|i>_<OP>), a parameter struct nb_params, and the kernel(s).
 * Every value lives in a register of its dtype's representation type (preamble:
 * float for f32 / f16 / bf16, already rounded; double; int32_t; int64_t; bool) and
 * is named v<k> (member k), o<k> / r<k> / q<k> (operand k read per element, per
 * row, once). */
#ifndef NABLA_CUDA_RENDER_H
#define NABLA_CUDA_RENDER_H

#include "cuda_be.h"

/* ---- growing text ---- */
typedef struct cr_buf {
  char *p;
  size_t n, cap;
  bool oom; /* an append failed: p is incomplete */
} cr_buf;
/* Appends printf-formatted text (sets oom on failure; later appends do nothing). */
void cr_put(cr_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- dtypes ---- */
enum { CR_DOM_F, CR_DOM_D, CR_DOM_I }; /* float, double, int64 */
int cr_domain(nb_dtype dt);
const char *cr_dtn(nb_dtype dt);  /* "f32" ... "bool": suffix of nb_ld_ / nb_st_ / nb_as_ */
const char *cr_repr(nb_dtype dt); /* the representation type */
const char *cr_dom_type(int dom); /* float, double, int64_t */
char cr_dom_letter(int dom);      /* f, d, i */
/* The preamble function turning a value of dtype from into domain dom of a
 * computation in dtype cdt (nb_tf, nb_td, nb_ti, or nb_th / nb_tb for an operand of
 * another dtype in an f16 / bf16 computation). */
const char *cr_to_domain(nb_dtype from, int dom, nb_dtype cdt);

/* ---- ops ---- */
/* The formula list's expression of op in domain dom, its arity and whether it is a
 * predicate; NULL when the list has none. */
const char *cr_formula(int dom, int op, int *arity, bool *pred);
bool cr_is_view(int op);   /* reshape, broadcast_to, identity, stop_gradient */
bool cr_is_reduce(int op); /* what ROW_REDUCE / GLOBAL_REDUCE members may be */
/* Whether member k is an elementwise member this generator renders (a formula, where,
 * cast or view of matching arity and dtypes). */
bool cr_elementwise_ok(const nbi_group *g, int k);
/* The dtype of source s of any member (s >= 0: member, else operand -1 - s). */
nb_dtype cr_src_dtype(const nbi_group *g, int s);

/* ---- kernel parameters: one struct of 8-byte fields ---- */
enum { CR_I64, CR_U64, CR_F64, CR_CPTR, CR_PTR };
#define CR_MAX_FIELDS 160
typedef struct cr_field {
  char name[12];
  uint8_t type, count; /* count 0: a scalar field (one word), else an array */
  uint16_t word;       /* first word */
} cr_field;

/* ---- a group's layout for one call: what the source depends on beyond g, and the
 * parameter values ---- */
#define CR_REFS (2 * NBI_FUSE_MAX)                /* operands, then output slots */
enum { CR_EW_SCALAR, CR_EW_FLAT, CR_EW_GENERAL }; /* elementwise classes */
enum { CR_COL_ZERO, CR_COL_CONTIG, CR_COL_STRIDED, CR_COL_GENERAL }; /* rows: cls & 3 */
enum { CR_ROW_ZERO = 0, CR_ROW_GENERAL = 4 };                        /* rows: cls & 4 */
typedef struct cr_sig { /* compared bytewise: zero-initialized */
  uint8_t kind, warp, nd, nrd, ncd, vec, vw, idx32;
  uint16_t block;
  uint8_t cache_k; /* rows: a row's columns per thread when registers keep them (0: not) */
  uint8_t pad;
  uint8_t cls[CR_REFS];
} cr_sig;

typedef struct cr_layout {
  cr_sig sig;
  int64_t n, cols; /* elementwise: n elements; rows: n rows of cols */
  /* elementwise: nd coalesced dims; rows: nrd row dims then ncd column dims */
  int64_t dims[2 * NB_MAX_DIMS];
  int64_t st[CR_REFS][2 * NB_MAX_DIMS];
  char *ptr[CR_REFS];
  int n_fields;
  cr_field f[CR_MAX_FIELDS];
  nbi_cuda_launch_cfg *cfg; /* words are written here */
  int sm_count;
} cr_layout;

/* Adds a field: one word (count 0) or an array of count words; the caller sets the
 * values through the returned word index. -1 when the parameter struct is full. */
int cr_field_add(cr_layout *L, const char *name, int type, int count);
/* Emits `struct nb_params { ... };`. */
void cr_emit_params(cr_buf *b, const cr_layout *L);
/* Emits the nbo_* functions of every (domain, op) the elementwise members use. */
void cr_emit_op_functions(cr_buf *b, const nbi_group *g);
/* Emits `const <repr> v<k> = ...;` for elementwise member k (role FULL, PER_ROW or
 * GLOBAL) of g, its sources named as documented at the top. */
void cr_emit_member(cr_buf *b, const nbi_group *g, int k);
/* The source name of member k's input s into out (see the top). */
void cr_src_name(const nbi_group *g, int k, int s, char out[16]);
/* Emits one line of the shape comment describing member k ("m3 = exp(m2): f32"). */
void cr_describe_member(cr_buf *b, const nbi_group *g, int k);

/* ---- row groups (cuda_render_rows.c) ---- */
/* Whether g (kind NBI_GROUP_ROWS) has a structure the row kernels handle. */
bool cr_rows_ok(const nbi_group *g);
/* The layout of g for these views (errors recorded) and the launch configuration. */
nb_status cr_rows_layout(const nbi_group *g, const nbi_view *out, const nbi_view *in, cr_layout *L);
/* Appends the kernels of g (after the preamble) for layout L named name. */
void cr_rows_render(cr_buf *b, const nbi_group *g, const cr_layout *L, const char *name);

#endif
