"""ninfer.kernels: CUDA kernels (CuPy RawModules compiled by NVRTC) with torch reference twins.

Imports torch and, lazily, cupy; never engine/, model/ or anything above. Each op lives in its
own folder (`<op>.cu`, `launch.py`, `reference.py`) and `dispatch.py` picks the CUDA launcher for
CUDA tensors when CuPy is present and the torch twin otherwise, so CPU code paths never need CuPy.
"""
