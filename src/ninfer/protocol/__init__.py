"""ninfer.protocol"""
