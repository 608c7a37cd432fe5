"""(being written)"""
METHODS = {}
FUNCTIONS = {}
