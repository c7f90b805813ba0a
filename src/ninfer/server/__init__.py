"""ninfer.server"""
