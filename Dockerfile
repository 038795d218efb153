# efficiency: one image for web (gunicorn), Celery worker and beat.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN apt-get update && apt-get install -y --no-install-recommends curl && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 efficiency
WORKDIR /app
COPY pyproject.toml README.md ./
RUN pip install --upgrade pip && pip install .
COPY . .
RUN DEBUG=false SECRET_KEY=collectstatic-only ALLOWED_HOSTS=localhost python manage.py collectstatic --noinput \
    && mkdir -p /data/media && chown -R efficiency /data
USER efficiency
EXPOSE 8000
# Threaded workers with request-head and body timeouts (gunicorn.conf.py, efficiency/webserver.py);
# WEB_CONCURRENCY workers x GUNICORN_THREADS threads. In compose, nginx is in front (efficiency/deploy/nginx.conf).
CMD ["gunicorn", "--config", "gunicorn.conf.py"]
