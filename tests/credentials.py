"""The credentials of the test suite's deployment.

tests/conftest.py puts the token and the admin key in the environment, so every service a test
starts alone (and every `turnout serve` child, which inherits the admin key but gets a generated
token) runs the secure path; test clients present these.
"""

from __future__ import annotations

from turnout.security import ClientCredentials

TEST_INTERNAL_TOKEN = "turnout-test-internal-token"
TEST_ADMIN_KEY = "turnout-test-admin-key"
# What the gateway or the router present to their peers.
INTERNAL = ClientCredentials(bearer=TEST_INTERNAL_TOKEN)
# The admin key allows everything the token does, and the admin RPCs; it also reaches into
# `turnout serve` stacks, whose internal token the tests do not know.
ADMIN = ClientCredentials(bearer=TEST_ADMIN_KEY)
