"""ninfer.model"""
