"""Tests of trimflow.proxy, one module per addon module, with mitmproxy's taddons/tflow."""
