"""Fixtures of the fit tests: the headless-chromium screenshot of a page, shared with the report tests."""

from helpers.pages import render_page  # noqa: F401 - fixture
