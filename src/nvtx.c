/* SPDX-License-Identifier: MIT */
/*
 * NVTX ranges and marks the program already emits, as markers in the trace. cuheap acts as an
 * NVTX injection library: NVTX_INJECTION64_PATH=/path/libcuheap.so (which `cuheap run` sets)
 * makes the NVTX loader call InitializeInjectionNvtx2, and we fill the core callbacks. Only
 * ASCII messages are recorded; a range push becomes "nvtx push: NAME", a pop "nvtx pop",
 * a mark "nvtx: NAME". Ranges opened before the process loaded the CUDA driver are not
 * recorded (cuheap starts with the driver, never before).
 */
#include <nvtx3/nvToolsExt.h>
#include <stdio.h>

#include "event.h"
#include "recorder.h"
#include "runtime.h"

#define CUHEAP_EXPORT __attribute__((visibility("default")))

static __thread int depth __attribute__((tls_model("initial-exec")));

static void mark(const char *prefix, const char *text)
{
    if (cuheap_busy)
        return; /* a signal handler's range inside cuheap's own work on this thread */
    if (!cuheap_recording() && !(cuheap_boot_if_cuda() && cuheap_recording()))
        return;
    cuheap_busy = 1; /* the re-entry guard (runtime.h): a hook reached now goes to the driver */
    /* longer than a label: the recorder cuts it between characters */
    char label[2 * CUHEAP_LABEL_MAX];
    snprintf(label, sizeof(label), "%s%s", prefix, text ? text : "");
    cuheap_record_mark(-1, label);
    cuheap_unbusy();
}

static const char *ascii_message(const nvtxEventAttributes_t *a)
{
    return a && a->messageType == NVTX_MESSAGE_TYPE_ASCII ? a->message.ascii : "";
}

static int NVTX_API range_push_a(const char *message)
{
    mark("nvtx push: ", message);
    return depth++;
}

static int NVTX_API range_push_ex(const nvtxEventAttributes_t *a)
{
    return range_push_a(ascii_message(a));
}

static int NVTX_API range_pop(void)
{
    mark("nvtx pop", "");
    return depth > 0 ? --depth : -1;
}

static void NVTX_API mark_a(const char *message)
{
    mark("nvtx: ", message);
}

static void NVTX_API mark_ex(const nvtxEventAttributes_t *a)
{
    mark_a(ascii_message(a));
}

static void install(NvtxFunctionTable table, unsigned size, unsigned id, NvtxFunctionPointer fn)
{
    if (id < size && table[id])
        *table[id] = fn;
}

CUHEAP_EXPORT int NVTX_API InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table);
CUHEAP_EXPORT int NVTX_API InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table)
{
    const NvtxExportTableCallbacks *cb = get_export_table(NVTX_ETID_CALLBACKS);
    NvtxFunctionTable table = NULL;
    unsigned size = 0;
    if (!cb || !cb->GetModuleFunctionTable ||
        !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size) || !table)
        return 0;
    install(table, size, NVTX_CBID_CORE_RangePushA, (NvtxFunctionPointer)range_push_a);
    install(table, size, NVTX_CBID_CORE_RangePushEx, (NvtxFunctionPointer)range_push_ex);
    install(table, size, NVTX_CBID_CORE_RangePop, (NvtxFunctionPointer)range_pop);
    install(table, size, NVTX_CBID_CORE_MarkA, (NvtxFunctionPointer)mark_a);
    install(table, size, NVTX_CBID_CORE_MarkEx, (NvtxFunctionPointer)mark_ex);
    return 1;
}
