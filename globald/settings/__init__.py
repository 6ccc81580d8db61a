"""Configuration: every key declared once (spec), the loaded and validated Config (config), the rules for librdkafka
properties (kafka_properties) and a table's declared value and key formats (typed_spec). Imports nothing of globald
but the shared vocabulary (``common``): every other package may read the settings.
"""
