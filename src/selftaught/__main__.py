from selftaught.cli import app

app()
