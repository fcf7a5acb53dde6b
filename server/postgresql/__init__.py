"""The PostgreSQL storage engine (``trireme.storage=postgresql``): partition logs durable as rows in the database."""
