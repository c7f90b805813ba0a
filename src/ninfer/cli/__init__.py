"""ninfer.cli"""
