"""ninfer.artifact"""
