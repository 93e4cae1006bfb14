# SPDX-License-Identifier: MIT
"""JAX with XLA's platform allocator (XLA_PYTHON_CLIENT_ALLOCATOR=platform: every buffer from
cudaMalloc and back to cudaFree, no BFC pool, no preallocation): a small transformer language
model trained with Adam written in jax.numpy, jit-compiled, batches alternating between two
sequence lengths (two compiled programs). What it exercises: another framework's allocation
pattern, its buffers sized and freed by XLA's runtime."""
import os

from jobcommon import CUDA, Job, pick, steps

os.environ.setdefault("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
if not CUDA:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

N = steps(30)
VOCAB, D, HEADS, LAYERS, BATCH = pick(4096, 256), pick(512, 64), 8, pick(4, 2), pick(16, 2)
LENGTHS = pick((128, 256), (16, 32))


def init(key):
    def dense(k, i, o):
        return jax.random.normal(k, (i, o), jnp.float32) / jnp.sqrt(i)
    keys = jax.random.split(key, 2 + 4 * LAYERS)
    p = {"tok": jax.random.normal(keys[0], (VOCAB, D)) * 0.02, "head": dense(keys[1], D, VOCAB),
         "blocks": []}
    for i in range(LAYERS):
        k = keys[2 + 4 * i: 6 + 4 * i]
        p["blocks"].append({"qkv": dense(k[0], D, 3 * D), "proj": dense(k[1], D, D),
                            "up": dense(k[2], D, 4 * D), "down": dense(k[3], 4 * D, D)})
    return p


def norm(x):
    m = x.mean(-1, keepdims=True)
    return (x - m) / jnp.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)


def forward(p, idx):
    x = p["tok"][idx]
    t = idx.shape[1]
    mask = jnp.tril(jnp.ones((t, t), bool))
    for b in p["blocks"]:
        q, k, v = jnp.split(norm(x) @ b["qkv"], 3, axis=-1)
        q, k, v = (z.reshape(z.shape[0], t, HEADS, D // HEADS).transpose(0, 2, 1, 3)
                   for z in (q, k, v))
        att = jnp.where(mask, q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(D // HEADS), -1e9)
        y = (jax.nn.softmax(att, -1) @ v).transpose(0, 2, 1, 3).reshape(x.shape)
        x = x + y @ b["proj"]
        x = x + jax.nn.gelu(norm(x) @ b["up"]) @ b["down"]
    return norm(x) @ p["head"]


def loss_fn(p, data):
    logits = forward(p, data[:, :-1])
    logp = jax.nn.log_softmax(logits, -1)
    return -jnp.take_along_axis(logp, data[:, 1:, None], -1).mean()


@jax.jit
def train_step(p, m, v, data, step):
    loss, g = jax.value_and_grad(loss_fn)(p, data)
    b1, b2, lr = 0.9, 0.999, 3e-4
    m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
    v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
    c1, c2 = 1 - b1 ** step, 1 - b2 ** step
    p = jax.tree_util.tree_map(lambda p, m, v: p - lr * (m / c1) / (jnp.sqrt(v / c2) + 1e-8),
                               p, m, v)
    return p, m, v, loss


key = jax.random.PRNGKey(0)
params = init(key)
mom = jax.tree_util.tree_map(jnp.zeros_like, params)
vel = jax.tree_util.tree_map(jnp.zeros_like, params)
job = Job("jax-train", skip=4)
for step in range(N):
    with job.step():
        key, k = jax.random.split(key)
        data = jax.random.randint(k, (BATCH, LENGTHS[step % 2] + 1), 0, VOCAB)
        params, mom, vel, loss = train_step(params, mom, vel, data, jnp.float32(step + 1))
        job.output(float(loss))  # waits for the step
job.report("backend=%s allocator=%s" % (jax.default_backend(),
                                       os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"]))
