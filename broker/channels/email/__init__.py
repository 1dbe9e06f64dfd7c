"""Email's shared parts: signed single-use decision links, and who an address decides as."""
