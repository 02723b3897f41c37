/* src/ops/nn.c — op records (skeleton: kernels and public functions to come). */
#include "../core/nbi.h"
