from django.conf import settings


def test_settings_come_from_the_test_environment():
    assert settings.DUCKGRES_RESHARD_LAUNCHER == "local"
    assert settings.CELERY_TASK_ALWAYS_EAGER is False
