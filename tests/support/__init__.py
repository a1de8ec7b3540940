"""Test infrastructure shared by every test layer (servers, builders), kept out of conftest."""
