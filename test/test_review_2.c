/* test/test_review_2.c — regressions found in the review of the nb_jit
 * executable, handle freelist and sharding changes. */
#include "common.h"

#include <nabla/sharding.h>

TestSuite(review2, .init = tc_setup, .fini = tc_teardown);

/* A sharded tensor kept out of its scope holds pending per-device nodes that
 * read x; nb_assign onto x must realize them first (they see the old x). */
Test(review2, assign_realizes_pending_shards_of_kept_tensor) {
  nb_mesh *m = nb_mesh_cpu("x=2");
  cr_assert(m, "%s", nb_last_error());
  static const char *const specs[] = {"x, _", "_, _"};
  for (int si = 0; si < 2; si++) {
    const double xv[] = {1, 2, 3, 4, 5, 6, 7, 8};
    nb_shape s = NB_SHAPE(4, 2);
    nb_tensor *x = tc_tensor(xv, s, NB_F32);
    nb_scope_begin();
    nb_tensor *y = nb_mul_scalar(nb_shard(x, m, specs[si]), 2.0);
    cr_assert(y, "%s", nb_last_error());
    nb_keep(y);
    nb_scope_end();
    const double zv[] = {0, 0, 0, 0, 0, 0, 0, 0};
    cr_assert_eq(nb_assign(x, tc_tensor(zv, s, NB_F32)), NB_OK, "%s", nb_last_error());
    double want[8];
    for (int i = 0; i < 8; i++)
      want[i] = 2 * xv[i];
    tc_assert_close_tol(y, want, s, 0);
  }
  nb_mesh_release(m);
}

/* nb_shard is a value: assigning to the tensor it placed afterwards leaves
 * the sharded tensor's values (a replicated placement too, where every
 * device's block is the whole tensor). */
Test(review2, assign_after_shard_keeps_the_sharded_values) {
  nb_mesh *m = nb_mesh_cpu("x=2");
  cr_assert(m, "%s", nb_last_error());
  static const char *const specs[] = {"_, _", "x, _", "_, x"};
  for (int si = 0; si < 3; si++) {
    const double xv[] = {1, 2, 3, 4, 5, 6, 7, 8}, zv[8] = {0};
    nb_shape s = NB_SHAPE(4, 2);
    nb_tensor *x = tc_tensor(xv, s, NB_F32);
    nb_tensor *y = nb_shard(x, m, specs[si]);
    cr_assert(y, "%s", nb_last_error());
    cr_assert(nb_eval(&y, 1) == NB_OK, "%s", nb_last_error());
    cr_assert_eq(nb_assign(x, tc_tensor(zv, s, NB_F32)), NB_OK, "%s", nb_last_error());
    tc_assert_close_tol(y, xv, s, 0);
  }
  nb_mesh_release(m);
}
