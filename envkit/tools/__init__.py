"""Agent tools that run on the host: the browser (Playwright driving Debian's Chromium)."""
