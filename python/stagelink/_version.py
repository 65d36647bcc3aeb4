"""The package version: meson.build's project version (a test compares
them).  SPDX-License-Identifier: MIT"""
__version__ = "0.1.0"
