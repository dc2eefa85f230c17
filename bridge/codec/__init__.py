"""Bytes to records and back: Avro decoding and encoding, the schema registry client."""
