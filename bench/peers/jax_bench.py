"""bench/peers/jax_bench.py: JAX (CPU, jax.jit) timing of the three training steps
bench/bench_mlp.c and bench/bench_train.c time for nabla (see torch_bench.py for the
cases). The whole step is one jitted function: value_and_grad and, for the two MLPs,
the SGD update (lr 0.01), returning the new parameters; the transformer case returns
the loss and every parameter's gradient. Each step ends with block_until_ready and
reads the loss, as nabla's benches do. Median of STEPS steps after WARMUP (the first
call compiles). One JSON line per case on stdout.

  python jax_bench.py [--smoke]
"""
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import STEPS, emit, time_steps  # noqa: E402

LR = 0.01


def setup_string():
    import jaxlib

    dev = jax.devices()[0]
    return (f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, backend {dev.platform} "
            f"({jax.device_count()} device), jax.jit of the whole step, "
            f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, {os.cpu_count()} CPUs visible")


def glorot(key, fan_in, fan_out):
    return jax.nn.initializers.glorot_uniform()(key, (fan_in, fan_out), jnp.float32)


def linear_params(key, sizes):
    ps = []
    for i in range(len(sizes) - 1):
        key, k = jax.random.split(key)
        ps += [glorot(k, sizes[i], sizes[i + 1]), jnp.zeros((sizes[i + 1],), jnp.float32)]
    return ps


def mlp(ps, h):
    n = len(ps) // 2
    for i in range(n):
        h = h @ ps[2 * i] + ps[2 * i + 1]
        if i < n - 1:
            h = jax.nn.relu(h)
    return h


def sgd_step(loss_fn):
    @jax.jit
    def step(ps, *data):
        loss, g = jax.value_and_grad(loss_fn)(ps, *data)
        return loss, [p - LR * gi for p, gi in zip(ps, g)]

    return step


def readme_mlp_case(key):
    k0, k1, k2 = jax.random.split(key, 3)
    ps = linear_params(k0, [1, 32, 64, 32, 1])
    x = jax.random.uniform(k1, (256, 1), jnp.float32)
    y = jax.random.uniform(k2, (256, 1), jnp.float32)
    return ps, (x, y), sgd_step(lambda ps, x, y: jnp.mean(jnp.square(mlp(ps, x) - y))), True


def cross_entropy(logits, labels):
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=-1))


def mlp784_case(key):
    k0, k1, k2 = jax.random.split(key, 3)
    ps = linear_params(k0, [784, 1024, 1024, 10])
    x = jax.random.uniform(k1, (256, 784), jnp.float32)
    labels = jax.random.randint(k2, (256,), 0, 10, jnp.int32)
    return ps, (x, labels), sgd_step(lambda ps, x, lab: cross_entropy(mlp(ps, x), lab)), True


D, HEADS, SEQ, BATCH, HIDDEN = 256, 4, 128, 8, 1024


def layer_norm(x, g, b, eps=1e-5):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps) * g + b


def block_loss(ps, x):
    g1, b1, wq, bq, wk, bk, wv, bv, wo, bo, g2, b2, w1, c1, w2, c2 = ps

    def heads(t):  # [B, S, D] -> [B, H, S, D/H]
        return t.reshape(BATCH, SEQ, HEADS, D // HEADS).transpose(0, 2, 1, 3)

    h = layer_norm(x, g1, b1)
    q, k, v = heads(h @ wq + bq), heads(h @ wk + bk), heads(h @ wv + bv)
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(jnp.float32(D // HEADS))
    a = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)
    r = x + a.transpose(0, 2, 1, 3).reshape(BATCH, SEQ, D) @ wo + bo
    h = layer_norm(r, g2, b2)
    out = r + jax.nn.gelu(h @ w1 + c1, approximate=False) @ w2 + c2
    return jnp.mean(out)


def transformer_case(key):
    ks = jax.random.split(key, 7)
    ones, zeros = jnp.ones((D,), jnp.float32), jnp.zeros((D,), jnp.float32)
    ps = [ones, zeros]
    for i in range(4):
        ps += [glorot(ks[i], D, D), zeros]
    ps += [ones, zeros, glorot(ks[4], D, HIDDEN), jnp.zeros((HIDDEN,), jnp.float32),
           glorot(ks[5], HIDDEN, D), zeros]
    x = jax.random.normal(ks[6], (BATCH, SEQ, D), jnp.float32)
    return ps, (x,), jax.jit(jax.value_and_grad(block_loss)), False


# case name and builder; warm-up and timed steps are common.STEPS
CASES = [
    ("readme_mlp_step", readme_mlp_case),
    ("mlp_784_1024_1024_10_step", mlp784_case),
    ("transformer_block_fwd_bwd", transformer_case),
]


def main():
    smoke = "--smoke" in sys.argv[1:]
    setup = setup_string()
    key = jax.random.PRNGKey(0)
    for name, build in CASES:
        warmup, steps = STEPS[name]
        if smoke:
            warmup, steps = 1, 3
        key, k = jax.random.split(key)
        ps, data, step_fn, update = build(k)
        state = {"ps": ps}

        def step():
            loss, out = step_fn(state["ps"], *data)
            jax.block_until_ready(out)
            if update:
                state["ps"] = out
            return float(loss)

        median, value = time_steps(step, warmup, steps)
        emit(name, "jax", steps, median, value, setup)

if __name__ == "__main__":
    main()
