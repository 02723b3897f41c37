/* src/train/train.h — internal contract of the training layer: schedules
 * (schedule.c) as the optimizers (optim.c) read them. */
#ifndef NABLA_TRAIN_INTERNAL_H
#define NABLA_TRAIN_INTERNAL_H

#include <nabla/optim.h>

#include "../transforms/tree.h"

enum { NBI_SCHED_CONSTANT, NBI_SCHED_LINEAR, NBI_SCHED_COSINE, NBI_SCHED_WARMUP_COSINE };

struct nb_schedule {
  int32_t refcount;
  int kind;
  double init, peak, end, alpha; /* as the constructors name them */
  int64_t steps, warmup;
};

#endif
