/* nabla/nabla.h — the umbrella header. Link with -lnabla
 * (pkg-config --cflags --libs nabla). */
#ifndef NABLA_NABLA_H
#define NABLA_NABLA_H

#include "tensor.h"
#include "ops.h"
#include "nn.h"
#include "transforms.h"
#include "custom.h"
#include "sharding.h"
#include "distributed.h"
#include "random.h"
#include "tree.h"
#include "optim.h"
#include "io.h"

#endif
