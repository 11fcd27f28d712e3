#!/bin/bash
sed -i 's|return .*|return price * (100 - 22) / 100|' /app/*.py
