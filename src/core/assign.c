/* src/core/assign.c — the single-device rebind behind nb_assign.
 *
 * nb_assign (src/transforms/backward.c) checks its arguments, casts and sends
 * a sharded dst to the sharding layer, which rebinds each physical tensor
 * through this function; so both reach down into core and the sharding layer
 * never calls the public, transforms-level nb_assign. */
#include "nbi.h"

#include <assert.h>

nb_status nbi_assign_rebind(nb_tensor *dst, nb_tensor *val) {
  assert(!dst->mesh && !val->mesh && dst->dtype == val->dtype);
  nb_scope_begin();
  /* Realize val and every pending tensor that reads dst first: nothing
   * computed before the assign may see dst's new value. dst's old value dies
   * there, so an elementwise update (w - lr * g) may write over it. */
  nb_status st = nbi_realize_assign(dst, val);
  if (!st && val->shard0.buf) {
    nbi_buffer *b = val->shard0.buf;
    nbi_buffer_retain(b);
    for (int sh = 0; sh < dst->n_shards; sh++)
      if (dst->shards[sh].buf) nbi_buffer_release(dst->shards[sh].buf);
    dst->shard0 = val->shard0;
    dst->shard0.buf = b;
    nbi_tensor_drop_graph(dst);
    nbi_lazy_remove(dst);
    dst->op = NBI_OP_CONST;
    dst->attrs = (nbi_attrs){0};
    dst->flags = (dst->flags & NBI_T_REQUIRES_GRAD) | NBI_T_REALIZED;
  }
  nb_scope_end();
  return st;
}
