"""ninfer.media"""
