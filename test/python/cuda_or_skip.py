"""What the CUDA tests need first: torch with a CUDA device, or exit 77
(a skip) saying which is missing.  SPDX-License-Identifier: MIT
"""
import sys


def require_cuda():
    """torch, once it sees a CUDA device; else the skip, with the reason."""
    try:
        import torch
    except ImportError as e:
        print("SKIP: %s (install python3-torch)" % e)
        sys.exit(77)
    if not torch.cuda.is_available():
        print("SKIP: torch sees no CUDA device (torch %s, built with CUDA %s)"
              % (torch.__version__, torch.version.cuda))
        sys.exit(77)
    return torch
