# SPDX-License-Identifier: MIT
"""JAX under cuheap: with XLA_PYTHON_CLIENT_ALLOCATOR=platform every buffer is a driver
allocation. Prints a checksum of a jitted computation and the allocation counts cuheap saw."""
import cuheap_probe
import jax
import jax.numpy as jnp


@jax.jit
def f(a, b):
    for _ in range(4):
        a = jnp.tanh(a @ b) + a
    return a.sum()


key = jax.random.PRNGKey(0)
total = 0.0
for i in range(20):
    k1, k2, key = jax.random.split(key, 3)
    a = jax.random.normal(k1, (512, 512), dtype=jnp.float32)
    b = jax.random.normal(k2, (512, 512), dtype=jnp.float32) * 0.01
    total += float(f(a, b))
print("checksum", float(total).hex())
print("cuheap:", cuheap_probe.call_counts(["cuMemAlloc_v2", "cuMemFree_v2", "cuMemAllocAsync", "cuMemCreate"]))
