from mathagent.cli import app

app(prog_name="mathagent")
