"""ninfer.kernels"""
