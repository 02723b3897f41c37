/* src/ops/identity.c — the graph-plumbing ops the transforms need.
 * IDENTITY: the same value under a new node. Transforms wrap each traced input
 * in one (a boundary their sweeps stop at) and each output they return.
 * STOP_GRADIENT (nb_detach): the same value with a zero derivative and no
 * provenance. Both alias their input's buffer: no kernel, no copy.
 * PLACEHOLDER: a symbolic trace input with no value (nbi_placeholder).
 * TUPLE_GET: output j of a multi-output pack, a view into the pack's buffer
 * (attrs.i[0] = j, i[1] = byte offset). The sweeps handle it together with
 * its pack (src/transforms/sweep.c), so it carries no rules of its own. */
#include "../core/nbi.h"

static bool alias_view(const nb_tensor *n, const nbi_view *in, nbi_view *out) {
  (void)n;
  out->data = in->data;
  memcpy(out->strides, in->strides, sizeof out->strides);
  return true;
}

static nb_status identity_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  (void)y;
  if (need[0]) gin[0] = gy;
  return NB_OK;
}

static nb_tensor *identity_jvp(nb_tensor *y, nb_tensor *const *tin) {
  (void)y;
  return tin[0];
}

nb_tensor *nbi_identity(nb_tensor *t) {
  if (nbi_any_null("nb_identity", &t, 1)) return NULL;
  return nbi_record(NBI_OP_IDENTITY, t->dtype, &t->shape, &t, 1, NULL);
}

nb_tensor *nb_detach(nb_tensor *t) {
  if (nbi_any_null("nb_detach", &t, 1)) return NULL;
  return nbi_record(NBI_OP_STOP_GRADIENT, t->dtype, &t->shape, &t, 1, NULL);
}

static bool tuple_get_view(const nb_tensor *n, const nbi_view *in, nbi_view *out) {
  out->data = in->data + n->attrs.i[1];
  nbi_contig_strides(&n->shape, out->strides);
  return true;
}

static nb_tensor *identity_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                                int64_t B) {
  (void)y, (void)batched, (void)B;
  return y->op == NBI_OP_STOP_GRADIENT ? nb_detach(bin[0]) : nbi_identity(bin[0]);
}

const nbi_op_def nbi_opdef_PLACEHOLDER = {
    .name = "placeholder", .arity = 0, .flags = NBI_OPF_NONDIFF};
const nbi_op_def nbi_opdef_TUPLE_GET = {.name = "tuple_get", .arity = 1, .view = tuple_get_view};

const nbi_op_def nbi_opdef_IDENTITY = {
    "identity",           1, NULL, alias_view, .vjp = identity_vjp, .jvp = identity_jvp,
    .vmap = identity_vmap};
const nbi_op_def nbi_opdef_STOP_GRADIENT = {
    "stop_gradient", 1, NULL, alias_view, .flags = NBI_OPF_NONDIFF, .vmap = identity_vmap};
