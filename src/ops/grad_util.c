/* src/ops/grad_util.c — small helpers shared by the VJP/JVP rules of every op
 * family (declared in nbi.h). Built from public ops, so they differentiate. */
#include "rule_util.h"
#include "../core/oprules.h"

nb_tensor *nbi_sum_to(nb_tensor *g, const nb_shape *s) {
  if (!g) return NULL;
  if (nbi_shape_eq(&g->shape, s)) return g;
  int lead = g->shape.ndim - s->ndim;
  nb_axes ax = {0};
  for (int d = 0; d < g->shape.ndim; d++)
    if (d < lead || (s->dims[d - lead] == 1 && g->shape.dims[d] != 1)) ax.v[ax.n++] = d;
  nb_tensor *r = ax.n ? nb_sum(g, ax, false) : g;
  if (!r) return NULL; /* out of memory: the error is recorded */
  return nbi_shape_eq(&r->shape, s) ? r : nb_reshape(r, *s);
}

nb_tensor *nbi_grad_fit(nb_tensor *g, const nb_tensor *x) {
  nb_tensor *r = nbi_sum_to(g, &x->shape);
  if (r && r->dtype != x->dtype) r = nb_cast(r, x->dtype);
  return r;
}

nb_tensor *nbi_zeros_of(const nb_shape *s, nb_dtype dt) {
  nb_tensor *z = nb_scalar(0, dt);
  return s->ndim ? nb_broadcast_to(z, *s) : z;
}

nb_tensor *nbi_zeros_like(const nb_tensor *x) {
  nb_tensor *z = nbi_full_on(x->device, &(nb_shape){0}, 0, x->dtype);
  return x->shape.ndim ? nb_broadcast_to(z, x->shape) : z;
}

nb_tensor *nbi_ones_like(const nb_tensor *x) {
  nb_tensor *o = nbi_full_on(x->device, &(nb_shape){0}, 1, x->dtype);
  return x->shape.ndim ? nb_broadcast_to(o, x->shape) : o;
}

nb_tensor *nbi_add_maybe(nb_tensor *a, nb_tensor *b) {
  if (!a) return b;
  if (!b) return a;
  return nb_add(a, b);
}
