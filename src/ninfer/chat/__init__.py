"""ninfer.chat"""
