from tests.notify.receiver import receiver  # noqa: F401 - the fixture
