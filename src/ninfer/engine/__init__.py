"""ninfer.engine"""
