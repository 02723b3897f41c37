/* src/ops/custom.c — user-defined ops (include/nabla/custom.h): the registry,
 * nb_custom_call, and the CUSTOM op that runs them.
 *
 * A call records one multi-output CUSTOM pack (nbi_record_multi) whose payload
 * points at the registered op; its hash is (op id, output types), so plans of
 * different ops never mix. The kernel hands the user's CPU kernel contiguous
 * buffers (copying strided inputs) and the outputs' slices of the pack. The
 * rules call the user's VJP / JVP (NULL cotangents and tangents replaced by
 * zeros) and batching rule; without a batching rule the op is applied once
 * per example and the results stacked (nbi_bat_loop's scheme, for several
 * outputs). Rule results are checked against the types they must have, with
 * errors naming the op.
 */
#include "../core/nbi.h"
#include "../core/oprules.h"
#include "../core/program.h"
#include "rule_util.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static const char *FN = "nb_custom_call";

/* ---- registry ------------------------------------------------------------------------ */
struct nb_custom_op {
  nb_custom_op_def def; /* name and sharding point at the copies below */
  char *name, *sharding;
  int64_t id;
};

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static nb_custom_op **reg;
static int n_reg, cap_reg;

__attribute__((destructor)) static void registry_cleanup(void) {
  for (int i = 0; i < n_reg; i++) {
    free(reg[i]->name);
    free(reg[i]->sharding);
    free(reg[i]);
  }
  free(reg);
  reg = NULL;
  n_reg = cap_reg = 0;
}

static nb_custom_op *find_locked(const char *name) {
  for (int i = 0; i < n_reg; i++)
    if (!strcmp(reg[i]->name, name)) return reg[i];
  return NULL;
}

/* Checks the sharding rule's grammar (custom.h) and its operand/result counts. */
static nb_status check_sharding(const char *name, const char *rule, int n_in, int n_out) {
  const char *R = "nb_custom_op_register";
  const char *arrow = strstr(rule, "->");
  if (!arrow || strstr(arrow + 2, "->"))
    return nbi_error(NB_ERR_ARG, "%s: op \"%s\": sharding rule \"%s\" needs exactly one \"->\"", R,
                     name, rule);
  /* factor names of the operands, to check the results' against */
  enum { MAXF = 64, MAXLEN = 32 };
  char seen[MAXF][MAXLEN];
  int n_seen = 0;
  bool operand_ellipsis = false;
  for (int side = 0; side < 2; side++) {
    const char *p = side ? arrow + 2 : rule, *end = side ? rule + strlen(rule) : arrow;
    int want = side ? n_out : n_in, count = 0;
    const char *what = side ? "result" : "operand";
    bool blank = true;
    for (const char *q = p; q < end; q++)
      blank &= isspace((unsigned char)*q) != 0;
    if (blank && want == 0) continue;
    while (true) { /* one operand per iteration */
      char mine[NB_MAX_DIMS + 1][MAXLEN];
      int n_mine = 0;
      bool ellipsis = false;
      while (p < end && *p != ',') {
        if (isspace((unsigned char)*p)) {
          p++;
          continue;
        }
        char tok[MAXLEN];
        int len = 0;
        if (!strncmp(p, "...", 3)) {
          if (ellipsis || n_mine)
            return nbi_error(NB_ERR_ARG,
                             "%s: op \"%s\": sharding rule \"%s\": \"...\" may only start %s %d", R,
                             name, rule, what, count);
          if (side && !operand_ellipsis)
            return nbi_error(NB_ERR_ARG,
                             "%s: op \"%s\": sharding rule \"%s\": result %d has \"...\" but no "
                             "operand has",
                             R, name, rule, count);
          ellipsis = true;
          operand_ellipsis |= !side;
          p += 3;
          continue;
        }
        if (!isalpha((unsigned char)*p) && *p != '_')
          return nbi_error(NB_ERR_ARG,
                           "%s: op \"%s\": sharding rule \"%s\": unexpected '%c' at offset %d", R,
                           name, rule, *p, (int)(p - rule));
        while (p < end && (isalnum((unsigned char)*p) || *p == '_')) {
          if (len + 1 >= MAXLEN)
            return nbi_error(NB_ERR_ARG,
                             "%s: op \"%s\": sharding rule \"%s\": a factor name is "
                             "longer than %d characters",
                             R, name, rule, MAXLEN - 1);
          tok[len++] = *p++;
        }
        tok[len] = '\0';
        for (int i = 0; i < n_mine; i++)
          if (!strcmp(mine[i], tok))
            return nbi_error(NB_ERR_ARG,
                             "%s: op \"%s\": sharding rule \"%s\": factor \"%s\" appears twice in "
                             "%s %d",
                             R, name, rule, tok, what, count);
        if (n_mine == NB_MAX_DIMS)
          return nbi_error(NB_ERR_ARG,
                           "%s: op \"%s\": sharding rule \"%s\": %s %d has more than "
                           "%d factors",
                           R, name, rule, what, count, NB_MAX_DIMS);
        strcpy(mine[n_mine++], tok);
        bool known = false;
        for (int i = 0; i < n_seen; i++)
          known |= !strcmp(seen[i], tok);
        if (side && !known)
          return nbi_error(NB_ERR_ARG,
                           "%s: op \"%s\": sharding rule \"%s\": factor \"%s\" of result %d "
                           "appears in no operand",
                           R, name, rule, tok, count);
        if (!side && !known) {
          if (n_seen == MAXF)
            return nbi_error(NB_ERR_ARG,
                             "%s: op \"%s\": sharding rule \"%s\" has more than %d "
                             "factors",
                             R, name, rule, MAXF);
          strcpy(seen[n_seen++], tok);
        }
      }
      count++;
      if (p >= end) break;
      p++; /* the comma */
    }
    if (count != want)
      return nbi_error(NB_ERR_ARG,
                       "%s: op \"%s\": sharding rule \"%s\" has %d %ss but the op has %d %s", R,
                       name, rule, count, what, want, side ? "outputs" : "inputs");
  }
  return NB_OK;
}

const nb_custom_op *nb_custom_op_register(const nb_custom_op_def *def) {
  const char *R = "nb_custom_op_register";
  if (!def) {
    nbi_error(NB_ERR_NULL, "%s: def is NULL", R);
    return NULL;
  }
  if (!def->name || !def->name[0]) {
    nbi_error(NB_ERR_ARG, "%s: the op needs a name", R);
    return NULL;
  }
  const char *nm = def->name;
  if (def->n_in < 0 || def->n_out < 1) {
    nbi_error(NB_ERR_ARG, "%s: op \"%s\" has n_in = %d and n_out = %d (need n_in >= 0, n_out >= 1)",
              R, nm, def->n_in, def->n_out);
    return NULL;
  }
  if (!def->infer || !def->cpu) {
    nbi_error(NB_ERR_ARG, "%s: op \"%s\" has no %s (it is required)", R, nm,
              !def->infer ? "shape/dtype inference callback (infer)" : "CPU kernel (cpu)");
    return NULL;
  }
  if (def->sharding && check_sharding(nm, def->sharding, def->n_in, def->n_out)) return NULL;
  nb_custom_op *op = calloc(1, sizeof *op);
  if (op) {
    op->def = *def;
    op->name = strdup(nm);
    op->sharding = def->sharding ? strdup(def->sharding) : NULL;
    op->def.name = op->name;
    op->def.sharding = op->sharding;
  }
  if (!op || !op->name || (def->sharding && !op->sharding)) {
    if (op) free(op->name), free(op->sharding);
    free(op);
    nbi_error(NB_ERR_OOM, "%s: out of memory", R);
    return NULL;
  }
  pthread_mutex_lock(&reg_lock);
  const char *err = NULL;
  if (find_locked(nm)) {
    err = "dup";
  } else if (n_reg == cap_reg) {
    int nc = cap_reg ? 2 * cap_reg : 16;
    nb_custom_op **g = realloc(reg, sizeof *g * (size_t)nc);
    if (g)
      reg = g, cap_reg = nc;
    else
      err = "oom";
  }
  if (!err) {
    op->id = n_reg;
    reg[n_reg++] = op;
  }
  pthread_mutex_unlock(&reg_lock);
  if (err) {
    free(op->name);
    free(op->sharding);
    free(op);
    if (err[0] == 'd')
      nbi_error(NB_ERR_ARG, "%s: an op named \"%s\" is already registered", R, nm);
    else
      nbi_error(NB_ERR_OOM, "%s: out of memory", R);
    return NULL;
  }
  return op;
}

const nb_custom_op *nb_custom_op_find(const char *name) {
  if (!name) return NULL;
  pthread_mutex_lock(&reg_lock);
  const nb_custom_op *op = find_locked(name);
  pthread_mutex_unlock(&reg_lock);
  return op;
}

const char *nb_custom_op_name(const nb_custom_op *op) { return op ? op->name : NULL; }
const char *nb_custom_op_sharding(const nb_custom_op *op) { return op ? op->sharding : NULL; }

/* ---- nb_custom_call --------------------------------------------------------------------- */
typedef struct custom_call {
  nbi_multi m; /* first: the outputs' types */
  const nb_custom_op *op;
  void *user;                  /* this call's (nbi_custom_call_user), else NULL */
  void (*release)(void *user); /* called when the node goes */
} custom_call;

static void call_destroy(nbi_payload *p) {
  custom_call *c = (custom_call *)p;
  nbi_multi_fini(&c->m);
  if (c->release) c->release(c->user);
  free(c);
}

/* The user pointer the callbacks of node n get. */
static void *user_of(const nb_tensor *n) {
  const custom_call *c = (const custom_call *)n->payload;
  return c->release ? c->user : c->op->def.user;
}

static const nb_custom_op *op_of(const nb_tensor *p) {
  return ((const custom_call *)p->payload)->op;
}

/* A callback failed with st: make sure the error names the op. */
static nb_status callback_failed(nb_status st, const nb_custom_op *op, const char *what) {
  if (nb_last_status() == NB_OK)
    nbi_error(st, "%s: the %s of op \"%s\" returned %s", FN, what, op->name, nb_status_str(st));
  return st;
}

static nb_status custom_call_with(const nb_custom_op *op, nb_tensor *const *in, int n_in,
                                  nb_tensor **out, int n_out, void *user, void (*release)(void *));

nb_status nb_custom_call(const nb_custom_op *op, nb_tensor *const *in, int n_in, nb_tensor **out,
                         int n_out) {
  return custom_call_with(op, in, n_in, out, n_out, NULL, NULL);
}

nb_status nbi_custom_call_user(const nb_custom_op *op, nb_tensor *const *in, int n_in,
                               nb_tensor **out, int n_out, void *user, void (*release)(void *)) {
  return custom_call_with(op, in, n_in, out, n_out, user, release);
}

static nb_status custom_call_with(const nb_custom_op *op, nb_tensor *const *in, int n_in,
                                  nb_tensor **out, int n_out, void *user, void (*release)(void *)) {
  bool taken = false; /* user handed to the payload */
  nb_status st = NB_OK;
  if (!out) {
    st = nbi_error(NB_ERR_NULL, "%s: out is NULL", FN);
    goto refused;
  }
  for (int j = 0; j < n_out; j++)
    out[j] = NULL;
  if (!op) {
    st = nbi_error(NB_ERR_NULL, "%s: op is NULL", FN);
    goto refused;
  }
  if (n_in != op->def.n_in || n_out != op->def.n_out) {
    st = nbi_error(NB_ERR_ARG,
                   "%s: op \"%s\" takes %d inputs and gives %d outputs, called with "
                   "n_in = %d and n_out = %d",
                   FN, op->name, op->def.n_in, op->def.n_out, n_in, n_out);
    goto refused;
  }
  if (n_in > 0 && !in) {
    st = nbi_error(NB_ERR_NULL, "%s: op \"%s\": in is NULL", FN, op->name);
    goto refused;
  }
  for (int k = 0; k < n_in; k++)
    if (in[k] && !in[k]->mesh && nbi_device_public(in[k]->device).kind == NB_DEVICE_CUDA &&
        !op->def.cuda) {
      st = nbi_error(NB_ERR_DEVICE, "%s: op \"%s\" has no CUDA kernel (input %d is on %s)", FN,
                     op->name, k, nbi_device_name(in[k]->device));
      goto refused;
    }
  for (int k = 0; k < n_in; k++)
    if (!in[k]) {
      st = nbi_error(NB_ERR_NULL, "%s: op \"%s\": input %d is NULL", FN, op->name, k);
      goto refused;
    }
  nb_shape *shp = calloc((size_t)(n_in + n_out) + 1, sizeof *shp);
  nb_dtype *dt = calloc((size_t)(n_in + n_out) + 1, sizeof *dt);
  custom_call *c = calloc(1, sizeof *c);
  st = shp && dt && c ? NB_OK : nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
  if (st) goto done;
  for (int k = 0; k < n_in; k++)
    shp[k] = in[k]->shape, dt[k] = in[k]->dtype;
  for (int j = 0; j < n_out; j++)
    dt[n_in + j] = NB_DTYPE_COUNT; /* "not written" */
  if ((st = op->def.infer(release ? user : op->def.user, shp, dt, n_in, shp + n_in, dt + n_in,
                          n_out))) {
    st = callback_failed(st, op, "shape inference");
    goto done;
  }
  for (int j = 0; j < n_out && !st; j++) {
    if (!nbi_dtype_valid(dt[n_in + j]))
      st = nbi_error(NB_ERR_DTYPE,
                     "%s: the shape inference of op \"%s\" gave no valid dtype for "
                     "output %d",
                     FN, op->name, j);
    else if (nbi_check_shape(FN, &shp[n_in + j]))
      st = nb_last_status();
  }
  if (st) goto done;
  uint64_t h1 = 0x637573746f6d2121ull, h2 = (uint64_t)op->id;
  nbi_hash_mix(&h1, &h2, (uint64_t)op->id);
  for (int j = 0; j < n_out; j++) {
    const nb_shape *s = &shp[n_in + j];
    nbi_hash_mix(&h1, &h2, (uint64_t)dt[n_in + j]);
    nbi_hash_mix(&h1, &h2, (uint64_t)s->ndim);
    for (int d = 0; d < s->ndim; d++)
      nbi_hash_mix(&h1, &h2, (uint64_t)s->dims[d]);
  }
  c->m.base = (nbi_payload){.refcount = 1, .destroy = call_destroy, .h1 = h1, .h2 = h2};
  c->op = op;
  c->user = user, c->release = release, taken = true;
  st = nbi_multi_init(FN, &c->m, n_out, shp + n_in, dt + n_in);
  if (!st) st = nbi_record_multi(NBI_OP_CUSTOM, in, n_in, &c->m, NULL, out);
  nbi_payload_release(&c->m.base);
  c = NULL;
done:
  free(shp);
  free(dt);
  free(c);
refused:
  if (!taken && release) release(user);
  return st;
}

/* ---- the kernel ----------------------------------------------------------------------------
 * On the CPU the op's CPU kernel reads and writes the tensors' memory; on CUDA
 * its CUDA kernel does, queued on the device's stream (an op without one is
 * refused when called, nb_custom_call). Other devices (NB_EMU) stage through
 * the host: inputs downloaded, the CPU kernel run, outputs uploaded. Inputs
 * that are not contiguous are first copied contiguous on their device. */
static nb_status custom_exec(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  const nb_custom_op *op = op_of(n);
  const nbi_multi *m = nbi_multi_of(n);
  int n_in = n->n_in, n_out = m->n_out, dev = n->device;
  nb_device_kind kind = nbi_device_public(dev).kind;
  bool staged = kind != NB_DEVICE_CPU && kind != NB_DEVICE_CUDA;
  nb_custom_buffer *ib = calloc((size_t)(n_in + n_out) + 1, sizeof *ib), *ob = ib + n_in;
  void **tmp = calloc((size_t)(n_in + n_out) + 1, sizeof *tmp); /* host or device blocks */
  nbi_buffer **dtmp = calloc((size_t)n_in + 1, sizeof *dtmp);
  nb_status st = ib && tmp && dtmp ? NB_OK : nbi_error(NB_ERR_OOM, "nb_eval: out of memory");
  for (int k = 0; k < n_in && !st; k++) {
    ib[k] =
        (nb_custom_buffer){.data = in[k].data, .shape = n->in[k]->shape, .dtype = n->in[k]->dtype};
    size_t nbytes = (size_t)nbi_numel(&ib[k].shape) * nb_dtype_size(ib[k].dtype);
    if (staged) {
      if (!(tmp[k] = malloc(nbytes ? nbytes : 1)))
        st = nbi_error(NB_ERR_OOM, "nb_eval: out of memory");
      else
        st = nbi_host_read(dev, &in[k], tmp[k], ib[k].dtype);
      ib[k].data = tmp[k];
      continue;
    }
    if (nbi_view_is_contiguous(&in[k])) continue;
    if (!(dtmp[k] = nbi_buffer_alloc(dev, nbytes))) {
      st = nb_last_status() ? nb_last_status() : NB_ERR_OOM;
      break;
    }
    nbi_view dst = in[k];
    dst.data = dtmp[k]->data;
    nbi_contig_strides(&ib[k].shape, dst.strides);
    st = nbi_dev_copy(dev, &dst, &in[k]);
    ib[k].data = dst.data;
  }
  for (int j = 0; j < n_out && !st; j++) {
    nbi_view v = nbi_multi_out_view(n, out, j);
    ob[j] = (nb_custom_buffer){.data = v.data, .shape = m->shape[j], .dtype = m->dtype[j]};
    size_t nbytes = (size_t)nbi_numel(&m->shape[j]) * nb_dtype_size(m->dtype[j]);
    if (staged && !(ob[j].data = tmp[n_in + j] = malloc(nbytes ? nbytes : 1)))
      st = nbi_error(NB_ERR_OOM, "nb_eval: out of memory");
  }
  if (!st && kind == NB_DEVICE_CUDA) {
    if ((st = op->def.cuda(user_of(n), nbi_device_native_stream(dev), ib, n_in, ob, n_out)))
      st = callback_failed(st, op, "CUDA kernel");
  } else if (!st && (st = op->def.cpu(user_of(n), ib, n_in, ob, n_out))) {
    st = callback_failed(st, op, "CPU kernel");
  }
  for (int j = 0; j < n_out && staged && !st; j++) {
    nbi_view v = nbi_multi_out_view(n, out, j);
    st = nbi_host_write(dev, &v, ob[j].data, m->dtype[j]);
  }
  for (int k = 0; k < n_in + n_out && tmp; k++)
    free(tmp[k]);
  for (int k = 0; k < n_in && dtmp; k++)
    nbi_buffer_release(dtmp[k]);
  free(ib);
  free(tmp);
  free(dtmp);
  return st;
}

/* ---- rules -------------------------------------------------------------------------------- */
/* Checks a rule's value v for something of type (s, dt) (B >= 0: behind a
 * batch dim of B). */
static nb_status check_type(const nb_custom_op *op, const char *rule, const char *what, int i,
                            const nb_tensor *v, const nb_shape *s, nb_dtype dt, int64_t B) {
  nb_shape want = *s;
  if (B >= 0) {
    if (want.ndim == NB_MAX_DIMS)
      return nbi_error(NB_ERR_SHAPE, "nb_vmap: op \"%s\": a batched output would have rank %d",
                       op->name, NB_MAX_DIMS + 1);
    memmove(want.dims + 1, want.dims, sizeof(int64_t) * (size_t)want.ndim);
    want.dims[0] = B;
    want.ndim++;
  }
  if (v && nbi_shape_eq(&v->shape, &want) && v->dtype == dt) return NB_OK;
  char a[160], b[160];
  if (!v)
    return nbi_error(NB_ERR_ARG, "%s: the %s of op \"%s\" left %s %d NULL", FN, rule, op->name,
                     what, i);
  return nbi_error(NB_ERR_SHAPE,
                   "%s: the %s of op \"%s\" gave %s %s for %s %d, which must be %s %s", FN, rule,
                   op->name, nb_dtype_name(v->dtype), nb_shape_str(v->shape, a, sizeof a), what, i,
                   nb_dtype_name(dt), nb_shape_str(want, b, sizeof b));
}

/* The op's outputs as tensors (new TUPLE_GETs of the pack) into outs. */
static nb_status outputs_of(nb_tensor *p, nb_tensor **outs) {
  for (int j = 0; j < nbi_multi_of(p)->n_out; j++)
    if (!(outs[j] = nbi_multi_get(p, j))) return nb_last_status();
  return NB_OK;
}

static nb_status custom_vjp(nb_tensor *p, nb_tensor *const *gys, const bool *need,
                            nb_tensor **gin) {
  const nb_custom_op *op = op_of(p);
  if (!op->def.vjp)
    return nbi_error(NB_ERR_STATE,
                     "%s: custom op \"%s\" has no VJP rule (register one to "
                     "differentiate it in reverse mode)",
                     FN, op->name);
  int n_in = p->n_in, n_out = op->def.n_out;
  nb_tensor **outs = calloc((size_t)(2 * n_out + n_in) + 1, sizeof *outs), **ct = outs + n_out,
            **g = ct + n_out;
  nb_status st = outs ? outputs_of(p, outs) : nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
  for (int j = 0; j < n_out && !st; j++)
    if (!(ct[j] = gys[j] ? gys[j] : nbi_zeros_like(outs[j]))) st = nb_last_status();
  if (!st && (st = op->def.vjp(op->def.user, p->in, n_in, outs, ct, n_out, g)))
    st = callback_failed(st, op, "VJP rule");
  for (int k = 0; k < n_in && !st; k++) {
    if (!need[k] || !g[k]) continue;
    if (!(st = check_type(op, "VJP rule", "input cotangent", k, g[k], &p->in[k]->shape,
                          p->in[k]->dtype, -1)))
      gin[k] = g[k];
  }
  free(outs);
  return st;
}

static nb_status custom_jvp(nb_tensor *p, nb_tensor *const *tin, nb_tensor **touts) {
  const nb_custom_op *op = op_of(p);
  if (!op->def.jvp)
    return nbi_error(NB_ERR_STATE,
                     "%s: custom op \"%s\" has no JVP rule (register one to "
                     "differentiate it in forward mode)",
                     FN, op->name);
  const nbi_multi *m = nbi_multi_of(p);
  int n_in = p->n_in, n_out = m->n_out;
  nb_tensor **outs = calloc((size_t)(2 * n_out + n_in) + 1, sizeof *outs), **to = outs + n_out,
            **tan = to + n_out;
  nb_status st = outs ? outputs_of(p, outs) : nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
  for (int k = 0; k < n_in && !st; k++)
    if (!(tan[k] = tin[k] ? tin[k] : nbi_zeros_like(p->in[k]))) st = nb_last_status();
  if (!st && (st = op->def.jvp(op->def.user, p->in, tan, n_in, outs, n_out, to)))
    st = callback_failed(st, op, "JVP rule");
  for (int j = 0; j < n_out && !st; j++) {
    if (!to[j] || !nb_dtype_is_float(m->dtype[j])) continue;
    if (!(st = check_type(op, "JVP rule", "output tangent", j, to[j], &m->shape[j], m->dtype[j],
                          -1)))
      touts[j] = to[j];
  }
  free(outs);
  return st;
}

/* The default batching rule: the op once per example, stacked (documented in
 * custom.h: correct for any op; B nodes instead of one). */
static nb_status batch_loop(nb_tensor *p, nb_tensor *const *bin, const bool *batched, int64_t B,
                            nb_tensor **outs) {
  const nb_custom_op *op = op_of(p);
  const nbi_multi *m = nbi_multi_of(p);
  int n_in = p->n_in, n_out = m->n_out;
  if (B > INT32_MAX)
    return nbi_error(NB_ERR_OVERFLOW,
                     "nb_vmap: op \"%s\": a batch of %lld examples is too large "
                     "for the per-example loop (give the op a batching rule)",
                     op->name, (long long)B);
  if (B == 0) {
    for (int j = 0; j < n_out; j++) {
      nb_shape s = {.ndim = m->shape[j].ndim + 1, .dims = {0}};
      memcpy(s.dims + 1, m->shape[j].dims, sizeof(int64_t) * (size_t)m->shape[j].ndim);
      if (!(outs[j] = nb_zeros(s, m->dtype[j]))) return nb_last_status();
    }
    return NB_OK;
  }
  nb_tensor **rows = calloc((size_t)(B * n_out + n_in) + 1, sizeof *rows), **in = rows + B * n_out;
  nb_status st = rows ? NB_OK : nbi_error(NB_ERR_OOM, "nb_vmap: out of memory");
  nb_tensor *local[8], **r = n_out <= 8 ? local : malloc(sizeof *r * (size_t)n_out);
  if (!r) st = nbi_error(NB_ERR_OOM, "nb_vmap: out of memory");
  for (int64_t b = 0; b < B && !st; b++) {
    for (int k = 0; k < n_in && !st; k++)
      if (!(in[k] = batched[k] ? nbi_bat_index(bin[k], b) : bin[k])) st = nb_last_status();
    if (!st) st = nb_custom_call(op, in, n_in, r, n_out);
    for (int j = 0; j < n_out && !st; j++)
      rows[j * B + b] = r[j];
  }
  for (int j = 0; j < n_out && !st; j++)
    if (!(outs[j] = nb_stack(rows + j * B, (int)B, 0))) st = nb_last_status();
  if (r != local) free(r);
  free(rows);
  return st;
}

static nb_status custom_vmap(nb_tensor *p, nb_tensor *const *bin, const bool *batched, int64_t B,
                             nb_tensor **outs) {
  const nb_custom_op *op = op_of(p);
  if (!op->def.batch) return batch_loop(p, bin, batched, B, outs);
  const nbi_multi *m = nbi_multi_of(p);
  nb_status st = op->def.batch(op->def.user, bin, batched, p->n_in, B, outs, m->n_out);
  if (st) return callback_failed(st, op, "batching rule");
  for (int j = 0; j < m->n_out && !st; j++)
    st = check_type(op, "batching rule", "output", j, outs[j], &m->shape[j], m->dtype[j], B);
  return st;
}

const nbi_op_def nbi_opdef_CUSTOM = {.name = "custom_call",
                                     .arity = -1,
                                     .exec = custom_exec,
                                     .flags = NBI_OPF_MULTI,
                                     .vjp_multi = custom_vjp,
                                     .jvp_multi = custom_jvp,
                                     .vmap_multi = custom_vmap};
