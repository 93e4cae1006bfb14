/* SPDX-License-Identifier: MIT */
/* A stand-in for PyTorch's libc10_cuda.so (tests/integration/test-live.c): its name is all. */
int cuheap_c10_stub(void);
int cuheap_c10_stub(void)
{
    return 0;
}
