"""Configuration: every key declared once (spec), the loaded and validated Config (config).
"""
