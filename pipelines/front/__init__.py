"""What users touch: the Session API, the command line, the console, the demo, reports, audit."""
