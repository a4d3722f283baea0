"""The product's settings for the suite and the processes it starts (the live stack inherits
DJANGO_SETTINGS_MODULE), with one change: passwords hashed with MD5. Django's default PBKDF2
costs half a CPU-second a hash by design, and one run's test processes made 74 (a user a test),
besides the stacks' logins (browser and websocket tests); no test is about the hash."""

from dashboard.settings import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
