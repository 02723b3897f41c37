/* src/backends/cpu/k_gemm_epi.c — GEMM epilogues: a planner group [matmul,
 * add bias, activation] (f32, 2-D) runs as one oneDNN matmul primitive with
 * the bias and an eltwise post-op, writing only the group's result.
 *
 * Groups below EPI_MIN_WORK multiply-adds (2^20) run on the small kernel of
 * k_gemm_small.c instead, on the calling thread: operands at their strides,
 * bias and relu in registers, other activations over the finished rows (the
 * bits of the unfused activation kernels), the sum stored first where it is
 * needed. There oneDNN's per-call costs exceed the product's arithmetic.
 *
 * Operands go in place when their matrices are row- or column-major with a
 * leading dimension (transposed views become strides of the memory
 * descriptor, as nbi_cpu_matmul's transpose flags); anything else is packed
 * once. When the sum (the activation's input) is needed outside the group, the
 * primitive writes the sum and a oneDNN eltwise primitive computes the
 * activation from it in a second pass.
 *
 * Primitives are created once per shape, strides and epilogue and cached (an
 * LRU of EPI_CACHE entries; creating one costs milliseconds, running it
 * microseconds). Should oneDNN offer only its reference implementation for a
 * case (slow), or fail, the group runs member by member through the ops' own
 * kernels instead.
 *
 * Rounding: the fused result is not bitwise the unfused one. The matmul
 * primitive may block the K sum differently from dnnl_sgemm, and oneDNN's
 * vectorized gelu/tanh/sigmoid/silu approximations differ from libm's in the
 * last bits (relu and the bias add themselves are exact). test_gemm_epi.c
 * compares with a tight relative tolerance for that reason. f64 (OpenBLAS)
 * products are not fused. */
#include "k_gemm_epi.h"

#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <pthread.h>
#include <string.h>

#include "k_gemm_small.h"
#include "k_linalg.h"

/* EPI_MIN_WORK: the multiply-adds below which a plain product stays on sgemm
 * and a group runs on the small kernel (k_gemm_small.c): a oneDNN primitive
 * always opens an OpenMP region, while gemm.c runs such products on the
 * calling thread (NBI_GEMM_SERIAL_MACS). */
enum { EPI_MIN_WORK = NBI_GEMM_SERIAL_MACS };

/* ---- matching ------------------------------------------------------------------------ */
static int act_alg(int op, float *alpha) {
  *alpha = 0;
  switch (op) {
  case NBI_OP_RELU: return dnnl_eltwise_relu;
  case NBI_OP_GELU: return dnnl_eltwise_gelu_erf;
  case NBI_OP_TANH: return dnnl_eltwise_tanh;
  case NBI_OP_SIGMOID: return dnnl_eltwise_logistic;
  case NBI_OP_SILU: *alpha = 1; return dnnl_eltwise_swish;
  default: return -1;
  }
}

/* IDENTITY and STOP_GRADIENT alias their input (no kernel). Transforms wrap
 * traced inputs in them, so a bias parameter's alias is often recorded between
 * the product and its add; the group then takes it in as a member. */
static bool is_alias(int op) { return op == NBI_OP_IDENTITY || op == NBI_OP_STOP_GRADIENT; }

/* Member src (or operand -1 - src) of g, looking through alias members. */
static int resolve(const nbi_group *g, int src) {
  while (src >= 0 && is_alias(g->m[src].op))
    src = g->m[src].src[0];
  return src;
}

/* An epilogue group as the planner describes it (backend.h, "GEMM epilogues"):
 * member 0 the product of operands a and b, then aliases, member add the sum
 * of the product and operand bias, then the activation when add + 1 < m. */
typedef struct epi_plan {
  int m, add, a, b, bias;
} epi_plan;

/* Parses g into p; false when it is not an f32 2-D epilogue this file runs. */
static bool epi_parse(const nbi_group *g, epi_plan *p) {
  float alpha;
  *p = (epi_plan){.m = g->n_members, .add = 1};
  if (g->kind != NBI_GROUP_GEMM || p->m < 2 || p->m > NBI_FUSE_MAX) return false;
  const nbi_group_member *mm = &g->m[0];
  if (mm->op != NBI_OP_MATMUL || mm->n_in != 2 || mm->dtype != NB_F32 || mm->shape.ndim != 2 ||
      mm->src[0] >= 0 || mm->src[1] >= 0 || mm->out >= 0)
    return false;
  p->a = -1 - mm->src[0], p->b = -1 - mm->src[1];
  if (g->operand[p->a].dtype != NB_F32 || g->operand[p->b].dtype != NB_F32) return false;
  while (p->add < p->m && is_alias(g->m[p->add].op)) {
    const nbi_group_member *e = &g->m[p->add++];
    if (e->n_in != 1 || e->src[0] >= 0) return false; /* aliases of outside values only */
  }
  if (p->add >= p->m || p->add + 2 < p->m) return false;
  const nbi_group_member *add = &g->m[p->add];
  if (add->op != NBI_OP_ADD || add->n_in != 2 || add->dtype != NB_F32 ||
      (add->src[0] == 0) == (add->src[1] == 0))
    return false;
  int bias = resolve(g, add->src[add->src[0] == 0 ? 1 : 0]);
  if (bias >= 0 || g->operand[-1 - bias].dtype != NB_F32) return false;
  p->bias = -1 - bias;
  if (p->add + 1 == p->m) return true;
  const nbi_group_member *act = &g->m[p->add + 1];
  return act->n_in == 1 && act->src[0] == p->add && act->dtype == NB_F32 &&
         act_alg(act->op, &alpha) >= 0;
}

bool nbi_cpu_gemm_epi_ok(const nbi_group *g) {
  epi_plan p;
  return epi_parse(g, &p);
}

/* ---- the primitive cache --------------------------------------------------------------- */
enum { EPI_CACHE = 64, KIND_MATMUL = 0, KIND_ELTWISE = 1 };

/* A primitive's key: matmul C = A @ B over nd dims (batch dims, then the
 * matrix dims) with A's and B's dims and element strides and C's dims (C is
 * contiguous); eltwise over a contiguous [cd[0], cd[1]]; the OpenMP threads
 * the primitive was made for (oneDNN fixes them at creation: a primitive made
 * while the contention guard or nb_set_num_threads gave one thread would run
 * on one thread ever after), filled in by epi_get. */
typedef struct epi_key {
  int64_t kind, alg, bias, nd, threads;
  int64_t ad[NB_MAX_DIMS], as[NB_MAX_DIMS], bd[NB_MAX_DIMS], bs[NB_MAX_DIMS], cd[NB_MAX_DIMS];
} epi_key;

typedef struct epi_prim {
  epi_key key;
  uint64_t hash;            /* of key */
  uint64_t used;            /* LRU clock; 0: empty slot */
  dnnl_primitive_t prim;    /* NULL: oneDNN had no good implementation */
  dnnl_memory_desc_t md[4]; /* matmul: src, weights, dst, bias; eltwise: data */
} epi_prim;

static pthread_mutex_t epi_lock = PTHREAD_MUTEX_INITIALIZER;
static epi_prim cache[EPI_CACHE];
static uint64_t epi_clock;
static dnnl_engine_t engine;
static dnnl_stream_t stream;

/* f32 memory descriptor of nd dims with strides (contiguous when NULL). */
static void md_nd(dnnl_memory_desc_t *md, int64_t nd, const int64_t *dims, const int64_t *strides) {
  dnnl_dims_t d, s;
  for (int64_t i = nd - 1, st = 1; i >= 0; i--) {
    d[i] = dims[i];
    s[i] = strides ? strides[i] : st;
    st *= dims[i];
  }
  dnnl_memory_desc_init_by_strides(md, (int)nd, d, dnnl_f32, s);
}

/* Creates e's primitive from its key; leaves e->prim NULL when oneDNN fails or
 * offers only a reference implementation. */
static void epi_create(epi_prim *e) {
  const epi_key *k = &e->key;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = dnnl_primitive_attr_create(&attr);
  if (s == dnnl_success && k->kind == KIND_MATMUL) {
    md_nd(&e->md[0], k->nd, k->ad, k->as);
    md_nd(&e->md[1], k->nd, k->bd, k->bs);
    md_nd(&e->md[2], k->nd, k->cd, NULL);
    int64_t bias_dims[NB_MAX_DIMS];
    for (int64_t i = 0; i < k->nd; i++)
      bias_dims[i] = i == k->nd - 1 ? k->cd[i] : 1;
    md_nd(&e->md[3], k->nd, bias_dims, NULL);
    if (k->alg >= 0) {
      float alpha = 0;
      int alg = k->alg;
      if (alg == dnnl_eltwise_swish) alpha = 1;
      s = dnnl_post_ops_create(&po);
      if (s == dnnl_success) s = dnnl_post_ops_append_eltwise(po, 1.0f, alg, alpha, 0.0f);
      if (s == dnnl_success) s = dnnl_primitive_attr_set_post_ops(attr, po);
    }
    dnnl_matmul_desc_t d;
    if (s == dnnl_success)
      s = dnnl_matmul_desc_init(&d, &e->md[0], &e->md[1], k->bias ? &e->md[3] : NULL, &e->md[2]);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &d, attr, engine, NULL);
  } else if (s == dnnl_success) {
    md_nd(&e->md[0], 2, k->cd, NULL);
    dnnl_eltwise_desc_t d;
    s = dnnl_eltwise_forward_desc_init(&d, dnnl_forward_inference, (dnnl_alg_kind_t)k->alg,
                                       &e->md[0], k->alg == dnnl_eltwise_swish ? 1.0f : 0.0f, 0.0f);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &d, attr, engine, NULL);
  }
  const char *impl = NULL;
  if (s == dnnl_success) s = dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
  if (s == dnnl_success && impl && strncmp(impl, "ref", 3) != 0)
    if (dnnl_primitive_create(&e->prim, pd) != dnnl_success) e->prim = NULL;
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (po) dnnl_post_ops_destroy(po);
  if (attr) dnnl_primitive_attr_destroy(attr);
}

/* Keys of plain products seen once (a ring): their primitive is created the
 * second time, so one-off shapes stay on sgemm and pay no creation cost. */
static epi_key seen[EPI_CACHE];
static uint64_t seen_hash[EPI_CACHE];
static int seen_next;

static bool seen_before(const epi_key *key, uint64_t h) {
  for (int i = 0; i < EPI_CACHE; i++)
    if (seen_hash[i] == h && memcmp(&seen[i], key, sizeof *key) == 0) return true;
  seen[seen_next] = *key;
  seen_hash[seen_next] = h;
  seen_next = (seen_next + 1) % EPI_CACHE;
  return false;
}

/* FNV-1a over the key's words: lookups compare hashes before keys. */
static uint64_t key_hash(const epi_key *key) {
  const int64_t *w = (const int64_t *)key;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < sizeof *key / sizeof *w; i++)
    h = (h ^ (uint64_t)w[i]) * 0x100000001b3ull;
  return h;
}

/* The cached primitive of key (created on a miss, evicting the least recently
 * used; with `second`, only on the key's second miss); NULL when there is none
 * to use. Called with epi_lock held. */
static epi_prim *epi_get(const epi_key *key_in, bool second) {
  epi_key with_threads = *key_in;
  with_threads.threads = omp_get_max_threads();
  const epi_key *key = &with_threads;
  if (!engine) {
    if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) return engine = NULL, NULL;
    if (dnnl_stream_create(&stream, engine, dnnl_stream_default_flags) != dnnl_success) {
      dnnl_engine_destroy(engine);
      return engine = NULL, NULL;
    }
  }
  uint64_t h = key_hash(key);
  epi_prim *victim = &cache[0];
  for (int i = 0; i < EPI_CACHE; i++) {
    epi_prim *e = &cache[i];
    if (e->used && e->hash == h && memcmp(&e->key, key, sizeof *key) == 0) {
      e->used = ++epi_clock;
      return e->prim ? e : NULL;
    }
    if (e->used < victim->used) victim = e;
  }
  if (second && !seen_before(key, h)) return NULL;
  if (victim->prim) dnnl_primitive_destroy(victim->prim);
  memset(victim, 0, sizeof *victim);
  victim->key = *key;
  victim->hash = h;
  victim->used = ++epi_clock;
  epi_create(victim);
  return victim->prim ? victim : NULL;
}

/* Runs e on args (memory objects made here around the raw pointers). */
static bool epi_exec(const epi_prim *e, int nargs, const int *arg, const int *md,
                     void *const *ptr) {
  dnnl_memory_t mem[4] = {0};
  dnnl_exec_arg_t args[4] = {{0}};
  bool ok = true;
  for (int i = 0; i < nargs && ok; i++) {
    ok = dnnl_memory_create(&mem[i], &e->md[md[i]], engine, ptr[i]) == dnnl_success;
    args[i] = (dnnl_exec_arg_t){arg[i], mem[i]};
  }
  if (ok) ok = dnnl_primitive_execute(e->prim, stream, nargs, args) == dnnl_success;
  if (ok) ok = dnnl_stream_wait(stream) == dnnl_success;
  for (int i = 0; i < nargs; i++)
    if (mem[i]) dnnl_memory_destroy(mem[i]);
  return ok;
}

/* C = act(A @ B + bias) through the cached primitive of key (bias, act: per
 * key.bias, key.alg; second: see epi_get); false when there is none or it
 * failed. */
static bool gemm_prim(const epi_key *key, bool second, const float *a, const float *b,
                      const float *bias, float *c) {
  pthread_mutex_lock(&epi_lock);
  const epi_prim *e = epi_get(key, second);
  bool done = false;
  if (e && key->bias)
    done =
        epi_exec(e, 4, (const int[]){DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_BIAS, DNNL_ARG_DST},
                 (const int[]){0, 1, 3, 2}, (void *const[]){(void *)a, (void *)b, (void *)bias, c});
  else if (e)
    done = epi_exec(e, 3, (const int[]){DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST},
                    (const int[]){0, 1, 2}, (void *const[]){(void *)a, (void *)b, c});
  pthread_mutex_unlock(&epi_lock);
  return done;
}

/* y = act(x) over m x n contiguous f32 (oneDNN eltwise, alg from act_alg). */
static bool eltwise_prim(int alg, int64_t m, int64_t n, const float *x, float *y) {
  epi_key key;
  memset(&key, 0, sizeof key);
  key.kind = KIND_ELTWISE;
  key.alg = alg;
  key.nd = 2;
  key.cd[0] = m;
  key.cd[1] = n;
  pthread_mutex_lock(&epi_lock);
  const epi_prim *e = epi_get(&key, false);
  bool done = e && epi_exec(e, 2, (const int[]){DNNL_ARG_SRC, DNNL_ARG_DST}, (const int[]){0, 0},
                            (void *const[]){(void *)x, y});
  pthread_mutex_unlock(&epi_lock);
  return done;
}

bool nbi_cpu_gemm_prim(int nd, const int64_t *ad, const int64_t *as, const float *a,
                       const int64_t *bd, const int64_t *bs, const float *b, const int64_t *cd,
                       float *c) {
  double work = (double)ad[nd - 1];
  for (int i = 0; i < nd; i++)
    work *= (double)cd[i];
  if (work < EPI_MIN_WORK) return false;
  epi_key key;
  memset(&key, 0, sizeof key);
  key.kind = KIND_MATMUL;
  key.alg = -1;
  key.nd = nd;
  memcpy(key.ad, ad, sizeof *ad * (size_t)nd);
  memcpy(key.as, as, sizeof *as * (size_t)nd);
  memcpy(key.bd, bd, sizeof *bd * (size_t)nd);
  memcpy(key.bs, bs, sizeof *bs * (size_t)nd);
  memcpy(key.cd, cd, sizeof *cd * (size_t)nd);
  return gemm_prim(&key, true, a, b, NULL, c);
}

/* ---- running a group --------------------------------------------------------------- */
/* A group being run: g's plan p, its operand views in, its output slots out. */
typedef struct epi_group {
  const nbi_group *g;
  epi_plan p;
  nbi_view *out;
  const nbi_view *in;
} epi_group;

/* Member k's output slot view, or NULL when it is not stored. */
static nbi_view *slot(const epi_group *eg, int k) {
  return eg->g->m[k].out >= 0 ? &eg->out[eg->g->m[k].out] : NULL;
}

/* The members one by one through the CPU's own kernels (values not stored
 * live in scratch, aliases alias): the path when oneDNN has no fast primitive
 * for the case. Also stores every stored alias member (both paths). */
static nb_status run_unfused(const epi_group *eg, bool aliases_only) {
  const nbi_group *g = eg->g;
  nbi_view v[NBI_FUSE_MAX];
  void *tmp[NBI_FUSE_MAX] = {0};
  nb_status st = NB_OK;
  for (int k = 0; k < g->n_members && !st; k++) {
    const nbi_group_member *e = &g->m[k];
    if (is_alias(e->op)) { /* its input is an operand */
      v[k] = eg->in[-1 - e->src[0]];
      if (slot(eg, k) && aliases_only) nbi_copy_view(slot(eg, k), &v[k]);
      continue;
    }
    if (aliases_only) continue;
    nbi_view in[2];
    for (int j = 0; j < e->n_in && j < 2; j++)
      in[j] = e->src[j] >= 0 ? v[e->src[j]] : eg->in[-1 - e->src[j]];
    if (slot(eg, k)) {
      v[k] = *slot(eg, k);
    } else {
      v[k] = (nbi_view){.dtype = e->dtype, .ndim = e->shape.ndim};
      memcpy(v[k].dims, e->shape.dims, sizeof v[k].dims);
      nbi_contig_strides(&e->shape, v[k].strides);
      tmp[k] = nbi_cpu_scratch("nb_eval", (size_t)nbi_numel(&e->shape) * nb_dtype_size(e->dtype));
      if (!(v[k].data = tmp[k])) st = NB_ERR_OOM;
    }
    /* the member as a node: what the kernels read (op, dtype, shape, attrs) */
    nb_tensor t = {.op = e->op, .dtype = e->dtype, .shape = e->shape, .n_in = e->n_in, .mark = -1};
    for (int a = 0; a < NBI_GROUP_ATTRS; a++)
      t.attrs.i[a] = e->ai[a];
    t.attrs.f[0] = e->af[0], t.attrs.f[1] = e->af[1];
    if (!st) st = nbi_cpu_run_op(NULL, &t, &v[k], in);
  }
  for (int k = 0; k < g->n_members; k++)
    nbi_cpu_scratch_free(tmp[k]);
  return st;
}

/* A GEMM operand: its data in place when row- or column-major with a leading
 * dimension (strides (ld, 1) or (1, ld)), else packed into *owned. */
static const float *operand(const nbi_view *v, int64_t s[2], void **owned) {
  bool trans;
  int64_t ld;
  *owned = NULL;
  if (nbi_cpu_gemm_layout(v, &trans, &ld)) {
    s[0] = trans ? 1 : ld;
    s[1] = trans ? ld : 1;
    return (const float *)v->data;
  }
  s[0] = v->dims[1];
  s[1] = 1;
  return nbi_cpu_contig("nb_matmul", v, NB_F32, owned);
}

/* The epilogue activation of op (NBI_EPI_NONE for none of them). */
static nbi_epi_act epi_act(int op) {
  switch (op) {
  case NBI_OP_RELU: return NBI_EPI_RELU;
  case NBI_OP_GELU: return NBI_EPI_GELU;
  case NBI_OP_TANH: return NBI_EPI_TANH;
  case NBI_OP_SIGMOID: return NBI_EPI_SIGMOID;
  case NBI_OP_SILU: return NBI_EPI_SILU;
  default: return NBI_EPI_NONE;
  }
}

/* A group below oneDNN's sizes on the small kernel, operands at their strides
 * (a, b: the product's 2-D inputs; bias: its row, [N] or [1, N]); the sum is
 * stored first where it is needed (two_pass), then the activation from it. */
static nb_status run_small(const epi_group *eg, const nbi_view *a, const nbi_view *b,
                           const nbi_view *bias, int res, bool two_pass) {
  int add = eg->p.add;
  bool has_act = add + 1 < eg->p.m;
  nbi_epi_act act = has_act ? epi_act(eg->g->m[add + 1].op) : NBI_EPI_NONE;
  int64_t rows = a->dims[0], cols = b->dims[1];
  nbi_gemm_small_args s = {.m = rows,
                           .n = cols,
                           .k = a->dims[1],
                           .a = (const float *)a->data,
                           .sa_r = a->strides[0],
                           .sa_c = a->strides[1],
                           .b = (const float *)b->data,
                           .sb_r = b->strides[0],
                           .sb_c = b->strides[1],
                           .bias = (const float *)bias->data,
                           .s_bias = bias->strides[bias->ndim - 1],
                           .act = two_pass ? NBI_EPI_NONE : act,
                           .c = (float *)slot(eg, res)->data,
                           .ldc = cols};
  nb_status st = nbi_gemm_small(&s);
  if (!st && two_pass && slot(eg, add + 1))
    nbi_epi_act_apply(act, (const float *)slot(eg, add)->data, (float *)slot(eg, add + 1)->data,
                      rows * cols);
  return st;
}

nb_status nbi_cpu_gemm_epi_run(const nbi_group *g, nbi_view *out, const nbi_view *in) {
  epi_group eg = {.g = g, .out = out, .in = in};
  if (!epi_parse(g, &eg.p))
    return nbi_error(NB_ERR_INTERNAL, "nb_eval: a GEMM group the CPU does not take");
  int add = eg.p.add;
  bool has_act = add + 1 < eg.p.m, two_pass = has_act && slot(&eg, add); /* the sum is needed too */
  int res = two_pass || !has_act ? add : add + 1;
  nb_status st = run_unfused(&eg, true); /* stored aliases */
  if (st || !slot(&eg, res)) return st;  /* no value of the group is needed */
  nbi_view a = in[eg.p.a], b = in[eg.p.b], bias = in[eg.p.bias];
  epi_key key;
  memset(&key, 0, sizeof key);
  key.kind = KIND_MATMUL;
  key.nd = 2;
  int64_t rows = a.dims[0], inner = a.dims[1], cols = b.dims[1];
  if (rows == 0 || cols == 0) return NB_OK;
  if (inner == 0) return run_unfused(&eg, false);
  if (nbi_gemm_small_fits(rows, cols, inner)) return run_small(&eg, &a, &b, &bias, res, two_pass);
  /* where OpenBLAS takes f32 GEMMs (gemm.c), it outruns oneDNN's fused
   * primitive by more than the epilogue's separate passes cost */
  if (nbi_cpu_sgemm_blas()) return run_unfused(&eg, false);
  key.ad[0] = key.cd[0] = rows;
  key.ad[1] = key.bd[0] = inner;
  key.bd[1] = key.cd[1] = cols;
  float alpha;
  key.alg = has_act && !two_pass ? act_alg(g->m[add + 1].op, &alpha) : -1;
  void *own[3];
  const float *pa = operand(&a, key.as, &own[0]), *pb = operand(&b, key.bs, &own[1]);
  bias.dims[0] = bias.dims[bias.ndim - 1]; /* [N] or [1, N]: the row is the last dim */
  bias.strides[0] = bias.strides[bias.ndim - 1];
  bias.ndim = 1;
  const float *pbias = (const float *)nbi_cpu_contig("nb_matmul", &bias, NB_F32, &own[2]);
  st = pa && pb && pbias ? NB_OK : NB_ERR_OOM;
  key.bias = 1;
  bool done = !st && gemm_prim(&key, false, pa, pb, pbias, (float *)slot(&eg, res)->data);
  if (done && two_pass && slot(&eg, add + 1))
    done = eltwise_prim(act_alg(g->m[add + 1].op, &alpha), rows, cols,
                        (const float *)slot(&eg, add)->data, (float *)slot(&eg, add + 1)->data);
  for (int k = 0; k < 3; k++)
    nbi_cpu_scratch_free(own[k]);
  if (!st && !done) st = run_unfused(&eg, false);
  return st;
}
