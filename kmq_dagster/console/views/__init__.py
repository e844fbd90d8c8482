"""The console's pages, each a Streamlit script the app's navigation runs after login."""
