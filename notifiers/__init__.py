"""notifiers"""
