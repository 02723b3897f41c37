/* src/train/schedule.c — learning-rate schedules (nabla/optim.h): one
 * formula per kind, evaluated on the host (nb_schedule_value) or recorded
 * as f64 ops on a step tensor (nb_schedule_at), so a jitted step reads the
 * step it is at. */
#include "train.h"

#include <math.h>
#include <stdlib.h>

static nb_schedule *make(const char *fn, nb_schedule v) {
  nb_schedule *s = malloc(sizeof *s);
  if (!s) {
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  *s = v;
  s->refcount = 1;
  return s;
}

nb_schedule *nb_schedule_constant(double value) {
  if (!isfinite(value)) {
    nbi_error(NB_ERR_ARG, "nb_schedule_constant: value is %g", value);
    return NULL;
  }
  return make("nb_schedule_constant", (nb_schedule){.kind = NBI_SCHED_CONSTANT, .init = value});
}

nb_schedule *nb_schedule_linear(double init, double end, int64_t steps) {
  if (!isfinite(init) || !isfinite(end) || steps < 1) {
    nbi_error(NB_ERR_ARG,
              "nb_schedule_linear: init %g, end %g, steps %lld (need finite values, "
              "steps >= 1)",
              init, end, (long long)steps);
    return NULL;
  }
  return make("nb_schedule_linear",
              (nb_schedule){.kind = NBI_SCHED_LINEAR, .init = init, .end = end, .steps = steps});
}

nb_schedule *nb_schedule_cosine(double init, int64_t steps, double alpha) {
  if (!isfinite(init) || !isfinite(alpha) || steps < 1) {
    nbi_error(NB_ERR_ARG,
              "nb_schedule_cosine: init %g, steps %lld, alpha %g (need finite values, "
              "steps >= 1)",
              init, (long long)steps, alpha);
    return NULL;
  }
  return make(
      "nb_schedule_cosine",
      (nb_schedule){.kind = NBI_SCHED_COSINE, .init = init, .steps = steps, .alpha = alpha});
}

nb_schedule *nb_schedule_warmup_cosine(double init, double peak, int64_t warmup_steps,
                                       int64_t steps, double end) {
  if (!isfinite(init) || !isfinite(peak) || !isfinite(end) || warmup_steps < 0 ||
      steps <= warmup_steps || peak == 0) {
    nbi_error(NB_ERR_ARG,
              "nb_schedule_warmup_cosine: init %g, peak %g, warmup_steps %lld, steps "
              "%lld, end %g (need finite values, peak != 0, steps > warmup_steps >= 0)",
              init, peak, (long long)warmup_steps, (long long)steps, end);
    return NULL;
  }
  return make("nb_schedule_warmup_cosine", (nb_schedule){.kind = NBI_SCHED_WARMUP_COSINE,
                                                         .init = init,
                                                         .peak = peak,
                                                         .end = end,
                                                         .warmup = warmup_steps,
                                                         .steps = steps});
}

nb_schedule *nb_schedule_retain(nb_schedule *s) {
  if (s) s->refcount++;
  return s;
}

void nb_schedule_release(nb_schedule *s) {
  if (s && --s->refcount == 0) free(s);
}

/* cosine decay from init to init * alpha over steps, at step t */
static double cosine_at(double init, double alpha, int64_t steps, double t) {
  double c = t < (double)steps ? t : (double)steps;
  return init * ((1 - alpha) * 0.5 * (1 + cos(M_PI * c / (double)steps)) + alpha);
}

double nb_schedule_value(const nb_schedule *s, int64_t step) {
  if (!s) {
    nbi_error(NB_ERR_NULL, "nb_schedule_value: s is NULL");
    return NAN;
  }
  double t = (double)(step < 0 ? 0 : step);
  switch (s->kind) {
  case NBI_SCHED_CONSTANT: return s->init;
  case NBI_SCHED_LINEAR: {
    double c = t < (double)s->steps ? t : (double)s->steps;
    return s->init + (s->end - s->init) * c / (double)s->steps;
  }
  case NBI_SCHED_COSINE: return cosine_at(s->init, s->alpha, s->steps, t);
  case NBI_SCHED_WARMUP_COSINE:
    if (t < (double)s->warmup) return s->init + (s->peak - s->init) * t / (double)s->warmup;
    return cosine_at(s->peak, s->end / s->peak, s->steps - s->warmup, t - (double)s->warmup);
  }
  return NAN;
}

/* The same formulas as f64 ops on t (0-d f64, the step). */
static nb_tensor *cosine_of(double init, double alpha, int64_t steps, nb_tensor *t) {
  nb_tensor *c = nb_minimum_scalar(t, (double)steps);
  nb_tensor *cs = nb_cos(nb_div_scalar(nb_mul_scalar(c, M_PI), (double)steps));
  return nb_mul_scalar(nb_add_scalar(nb_mul_scalar(nb_add_scalar(cs, 1), (1 - alpha) * 0.5), alpha),
                       init);
}

nb_tensor *nb_schedule_at(const nb_schedule *s, nb_tensor *step) {
  const char *fn = "nb_schedule_at";
  if (!s || !step) {
    nbi_error(NB_ERR_NULL, "%s: %s is NULL", fn, s ? "step" : "s");
    return NULL;
  }
  if (nb_dtype_is_float(step->dtype) || step->dtype == NB_BOOL || nbi_numel(&step->shape) != 1) {
    char b[160];
    nbi_error(NB_ERR_ARG, "%s: step is %s %s; it must be one integer", fn,
              nb_dtype_name(step->dtype), nb_shape_str(step->shape, b, sizeof b));
    return NULL;
  }
  nb_tensor *t = nb_maximum_scalar(nb_cast(nb_reshape(step, NB_SCALAR_SHAPE), NB_F64), 0);
  switch (s->kind) {
  case NBI_SCHED_CONSTANT: return nbi_full_on(t ? t->device : 0, &(nb_shape){0}, s->init, NB_F64);
  case NBI_SCHED_LINEAR:
    return nb_add_scalar(
        nb_div_scalar(nb_mul_scalar(nb_minimum_scalar(t, (double)s->steps), s->end - s->init),
                      (double)s->steps),
        s->init);
  case NBI_SCHED_COSINE: return cosine_of(s->init, s->alpha, s->steps, t);
  case NBI_SCHED_WARMUP_COSINE: {
    nb_tensor *warm =
        s->warmup
            ? nb_add_scalar(nb_div_scalar(nb_mul_scalar(t, s->peak - s->init), (double)s->warmup),
                            s->init)
            : NULL;
    nb_tensor *cosv = cosine_of(s->peak, s->end / s->peak, s->steps - s->warmup,
                                nb_sub_scalar(t, (double)s->warmup));
    return warm ? nb_where(nb_lt_scalar(t, (double)s->warmup), warm, cosv) : cosv;
  }
  }
  return NULL;
}
