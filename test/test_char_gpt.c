/* test/test_char_gpt.c — the "done when": nb_gpt trained for 50
 * steps matches a PyTorch version of the same model (test/golden/char_gpt.txt,
 * written by test/golden/gen_char_gpt.py, which states the model, the
 * batches and the optimizer): the same initial float32 weights, loaded with
 * nb_load_safetensors from test/golden/char_gpt_init.safetensors (written by
 * safetensors.torch.save_file), the same batches (one 64-bit LCG on both
 * sides), dropout off, AdamW with clipping and a warmup-cosine rate; every
 * step's loss to 1e-4. The step is the one of examples/char_gpt.c: a jitted
 * nb_value_and_grad of a function of trees, then nb_optim_step. */
#include "golden_file.h"

TestSuite(char_gpt, .init = tc_setup, .fini = tc_teardown);

#define CG_TOL 1e-4

/* in: params, batch {"x", "y"} -> {"loss"} */
static nb_status cg_loss(void *user, nb_tree *const *in, int n_in, nb_tree **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *logits = nb_gpt_apply(in[0], user, nb_tree_get(in[1], "x"), NULL);
  nb_tensor *loss = nb_cross_entropy(logits, nb_tree_get(in[1], "y"));
  if (!loss) return nb_last_status();
  out[0] = nb_tree_create();
  return nb_tree_set(out[0], "loss", loss);
}

Test(char_gpt, fifty_adamw_steps_match_pytorch_losses) {
  gf_case *c = gf_load("char_gpt.txt", "char_gpt");
  const gf_rec *cfg = gf_find(c, "config"), *tok = gf_find(c, "tokens");
  const gf_rec *want = gf_find(c, "losses");
  int64_t vocab = (int64_t)cfg->v[0], T = (int64_t)cfg->v[1], n = tok->shape.dims[0];
  int B = (int)cfg->v[5], steps = (int)cfg->v[6];
  nb_gpt_config gc = {
      .vocab = vocab,
      .context = T,
      .n_layers = (int)cfg->v[3],
      .block = {.dim = (int64_t)cfg->v[2], .n_heads = (int)cfg->v[4], .bias = true}};
  /* the golden weights (the file's order is by name), in the order of nb_gpt_init's tree;
   * every entry must be there with nb_gpt's shape and nothing else */
  char path[1024];
  const char *src = __FILE__, *slash = strrchr(src, '/');
  snprintf(path, sizeof path, "%.*sgolden/char_gpt_init.safetensors",
           slash ? (int)(slash - src + 1) : 0, src);
  nb_tree *loaded = nb_load_safetensors(path);
  cr_assert(loaded, "%s", nb_last_error());
  nb_tree *fresh = nb_gpt_init(nb_key(0), &gc, NB_F32), *params = nb_tree_create();
  cr_assert_eq(nb_tree_len(loaded), nb_tree_len(fresh), "the file has %d weights, nb_gpt %d",
               nb_tree_len(loaded), nb_tree_len(fresh));
  for (int i = 0; i < nb_tree_len(fresh); i++) {
    nb_tensor *w = nb_tree_get(loaded, nb_tree_name(fresh, i));
    cr_assert(w, "the file has no \"%s\"", nb_tree_name(fresh, i));
    nb_tree_set(params, nb_tree_name(fresh, i), w);
  }
  cr_assert(nb_tree_same_structure(params, fresh, true), "the golden weights' shapes and dtypes");
  nb_tree_release(fresh), nb_tree_release(loaded);

  nb_fn *f = nb_fn_create_trees(cg_loss, &gc, 2, 1), *vg = nb_value_and_grad(f, NB_AXES(0));
  nb_fn *step_fn = nb_jit(vg);
  nb_optim *parts[2] = {nb_clip_by_global_norm(1.0), nb_adamw(1e-2, 0.9, 0.95, 1e-8, 0.1)};
  nb_optim *opt = nb_optim_chain(parts, 2);
  nb_schedule *lr = nb_schedule_warmup_cosine(0, 1e-2, 5, steps, 1e-3);
  cr_assert_eq(nb_optim_set_schedule(opt, lr), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_optim_set_decay_mask(opt, nb_decay_matrices, NULL), NB_OK);
  nb_tree *state = nb_optim_init(opt, params);

  uint64_t lcg = 42;
  int32_t *x = malloc(sizeof *x * (size_t)(B * T)), *y = malloc(sizeof *y * (size_t)(B * T));
  double worst = 0;
  for (int step = 0; step < steps; step++) {
    nb_scope_begin();
    for (int b = 0; b < B; b++) {
      lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
      int64_t at = (int64_t)((lcg >> 33) % (uint64_t)(n - T - 1));
      for (int64_t i = 0; i < T; i++)
        x[b * T + i] = (int32_t)tok->v[at + i], y[b * T + i] = (int32_t)tok->v[at + i + 1];
    }
    nb_tree *batch = nb_tree_create(), *out[2];
    nb_tree_set(batch, "x", nb_from_data(x, NB_SHAPE(B, T), NB_I32));
    nb_tree_set(batch, "y", nb_from_data(y, NB_SHAPE(B, T), NB_I32));
    cr_assert_eq(nb_call_trees(step_fn, (nb_tree *[]){params, batch}, out), NB_OK, "step %d: %s",
                 step, nb_last_error());
    cr_assert_eq(nb_optim_step(opt, params, out[1], state), NB_OK, "step %d: %s", step,
                 nb_last_error());
    double got = nb_item(nb_tree_get(out[0], "loss")), err = fabs(got - want->v[step]);
    worst = fmax(worst, err);
    cr_assert(err <= CG_TOL, "step %d: loss %.7f, PyTorch %.7f", step, got, want->v[step]);
    nb_tree_release(out[0]), nb_tree_release(out[1]), nb_tree_release(batch);
    nb_scope_end();
  }
  if (getenv("NABLA_TEST_VERBOSE"))
    printf("char_gpt: %d steps, loss %.5f -> %.5f, largest difference from PyTorch %.2e\n", steps,
           want->v[0], want->v[steps - 1], worst);
  free(x), free(y);
  nb_tree_release(state);
  nb_schedule_release(lr);
  nb_optim_release(parts[0]), nb_optim_release(parts[1]), nb_optim_release(opt);
  nb_fn_release(step_fn), nb_fn_release(vg), nb_fn_release(f);
  nb_tree_release(params);
  gf_free(c);
}
