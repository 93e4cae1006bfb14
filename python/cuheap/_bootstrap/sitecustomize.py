# SPDX-License-Identifier: MIT
"""`cuheap run --torch`: put first on PYTHONPATH, Python runs this at start-up in every
interpreter of the run. It makes cuheap PyTorch's allocator the moment the program's
`import torch` finishes (before any CUDA tensor can exist), through the library named in
CUHEAP_TORCH, then runs the sitecustomize it stands in front of. A program that picks an
allocator itself (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, or its own
change_current_allocator) keeps it, with one warning. Standard library only, and nothing of
it runs until torch is imported.
"""
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_warned = False


def _say(msg):
    sys.stderr.write("cuheap: " + msg + "\n")


def _warn_once(msg):
    global _warned
    if not _warned:
        _warned = True
        _say(msg)


def _chosen_elsewhere():
    """What the environment chose instead of PyTorch's native allocator, or None."""
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        conf = os.environ.get(var, "")
        for item in conf.split(","):
            key, _, value = item.partition(":")
            if key.strip() == "backend" and value.strip() not in ("", "native"):
                return "%s=%s" % (var, conf)
    return None


def _torch_imported(torch):
    lib = os.environ.get("CUHEAP_TORCH")
    if not lib:
        return
    chosen = _chosen_elsewhere()
    if chosen:
        _warn_once("--torch: %s chose PyTorch's allocator; left alone (cuheap records what "
                   "reaches the driver, not each tensor)" % chosen)
        return
    try:
        memory = torch.cuda.memory
        own = memory.change_current_allocator
        alloc = memory.CUDAPluggableAllocator(lib, "cuheap_torch_alloc", "cuheap_torch_free")
        own(alloc)
    except Exception as e:  # a CPU-only PyTorch, an allocator already in use
        _warn_once("--torch: PyTorch's allocator stays (%s: %s)" % (type(e).__name__, e))
        return

    def change_current_allocator(allocator):
        """The program picks its own allocator: it keeps it."""
        _warn_once("--torch: the program chose its own CUDA allocator; left alone (cuheap "
                   "records what reaches the driver, not each tensor)")
        return own(allocator)

    change_current_allocator.__wrapped__ = own
    memory.change_current_allocator = change_current_allocator
    if getattr(torch.cuda, "change_current_allocator", None) is own:
        torch.cuda.change_current_allocator = change_current_allocator


class _TorchFinder:
    """First on sys.meta_path until torch is imported: finds it as the finders after it do and
    has its loader call _torch_imported() once the module ran."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module):
            run(module)
            try:
                _torch_imported(module)
            except Exception as e:  # never the program's failure
                _warn_once("--torch: %s: %s" % (type(e).__name__, e))

        loader.exec_module = exec_module
        return spec


def _chain():
    """The sitecustomize that would have run without this one."""
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # as site.py does for a failing sitecustomize
        _say("--torch: the program's sitecustomize failed: %s: %s" % (type(e).__name__, e))


if "torch" in sys.modules:  # imported already (a sitecustomize that ran before: unlikely)
    _torch_imported(sys.modules["torch"])
else:
    sys.meta_path.insert(0, _TorchFinder())
_chain()
