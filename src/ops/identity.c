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
#include "../core/oprules.h"

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
    .name = "placeholder", .arity = 0, .flags = NBI_OPF_NONDIFF | NBI_OPF_NO_KERNEL};
const nbi_op_def nbi_opdef_TUPLE_GET = {
    .name = "tuple_get", .arity = 1, .view = tuple_get_view, .flags = NBI_OPF_NO_KERNEL};

const nbi_op_def nbi_opdef_IDENTITY = {.name = "identity",
                                       .arity = 1,
                                       .view = alias_view,
                                       .vjp = identity_vjp,
                                       .jvp = identity_jvp,
                                       .flags = NBI_OPF_NO_KERNEL,
                                       .vmap = identity_vmap};
const nbi_op_def nbi_opdef_STOP_GRADIENT = {.name = "stop_gradient",
                                            .arity = 1,
                                            .view = alias_view,
                                            .flags = NBI_OPF_NONDIFF | NBI_OPF_NO_KERNEL,
                                            .vmap = identity_vmap};

/* ---- device moves ------------------------------------------------------------------
 * TO_DEVICE: the value of its input on another device (attrs.i[0] = the
 * target's device-table index). Core runs it on any pair of devices: to or
 * from the CPU by one upload or download, between two other devices through
 * host memory. Its derivative moves cotangents and tangents along. */
static nb_status to_device_exec(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  return nbi_copy_between(n->device, out, n->in[0]->device, &in[0]);
}

static nb_tensor *to_device_index(nb_tensor *t, int dev) {
  if (t->device == dev) { /* already there: the same tensor, registered like a new one */
    return nbi_scope_register(nb_retain(t));
  }
  nbi_attrs at = {0};
  at.i[0] = dev;
  return nbi_record(NBI_OP_TO_DEVICE, t->dtype, &t->shape, &t, 1, &at);
}

nb_tensor *nb_to_device(nb_tensor *t, nb_device d) {
  if (nbi_any_null("nb_to_device", &t, 1)) return NULL;
  int dev = nbi_device_lookup("nb_to_device", d);
  if (dev < 0) return NULL;
  nb_tensor *x = nbi_readable("nb_to_device", t);
  return x ? to_device_index(x, dev) : NULL;
}

static nb_status to_device_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (need[0]) gin[0] = to_device_index(gy, y->in[0]->device);
  return need[0] && !gin[0] ? nb_last_status() : NB_OK;
}

static nb_tensor *to_device_jvp(nb_tensor *y, nb_tensor *const *tin) {
  return to_device_index(tin[0], y->device);
}

static nb_tensor *to_device_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                                 int64_t B) {
  (void)batched, (void)B;
  return to_device_index(bin[0], y->device);
}

const nbi_op_def nbi_opdef_TO_DEVICE = {.name = "to_device",
                                        .arity = 1,
                                        .exec = to_device_exec,
                                        .vjp = to_device_vjp,
                                        .jvp = to_device_jvp,
                                        .vmap = to_device_vmap};
