"""Unit tests of the Slack surface: parsing `/gpu` text and building Block Kit."""
